"""comlrl_core.run.seeds: the seed derivation, and blocks of torch draws seeded from it."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from comlrl_core.run.seeds import derive_seed, torch_seeded


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**40), st.lists(st.integers(0, 2**20), max_size=4))
def test_derived_seeds_are_stable_in_range_and_order_sensitive(base, keys):
    seed = derive_seed(base, *keys)
    assert 0 <= seed < 2**31 and seed == derive_seed(base, *keys)
    if len(keys) >= 2 and keys[0] != keys[1]:
        assert derive_seed(base, keys[1], keys[0], *keys[2:]) != seed


def test_a_seeded_block_draws_from_its_seed_and_leaves_the_callers_stream_alone():
    torch.manual_seed(123)
    expected_after = torch.rand(3)
    torch.manual_seed(123)
    with torch_seeded(7):
        first = torch.randn(5)
    with torch_seeded(7):
        again = torch.randn(5)
    with torch_seeded(8):
        other = torch.randn(5)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert torch.equal(torch.rand(3), expected_after)  # as if the blocks had not run
