"""comlrl_core.models.prefill: the prompts' common beginning is encoded once per run of
rows with one adapter, and the call then samples what the full prompts give."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from comlrl_core.models.prefill import MIN_SHARED_PREFIX, chunked_prefill, shared_prefix_runs
from comlrl_core.models.sampling import cache_kwarg_name, padded_position_ids
from comlrl_core.policy import GenerationConfig

MAX_NEW = 6


@settings(max_examples=200, deadline=None)
@given(
    common=st.integers(0, 40),
    tails=st.lists(st.lists(st.integers(3, 9), min_size=0, max_size=6), min_size=1, max_size=6),
    adapters=st.lists(st.sampled_from(["a", "b"]), min_size=6, max_size=6),
    mixed=st.booleans(),
)
def test_runs_share_exactly_their_common_beginning(common, tails, adapters, mixed):
    # rows: one shared beginning, then tokens from another range (so it ends where intended)
    prompts = [[1 + i % 2 for i in range(common)] + tail for tail in tails]
    assume(all(prompts))  # a prompt has at least one token (encode_prompt)
    names = sorted(adapters[: len(prompts)]) if mixed else None
    runs = shared_prefix_runs(prompts, names)
    assert [i for run, _ in runs for i in run] == list(range(len(prompts)))  # every row once, in order
    for run, shared in runs:
        rows = [prompts[i] for i in run]
        if names is not None:
            assert len({names[i] for i in run}) == 1  # one adapter per run
        assert shared == 0 or shared >= MIN_SHARED_PREFIX
        assert all(r[:shared] == rows[0][:shared] for r in rows)  # really common
        assert all(len(r) > shared for r in rows)  # each row keeps a token of its own
        if len(rows) > 1 and shared == 0:  # too short to pay, or one row ends inside it
            lcp = 0
            while lcp < min(map(len, rows)) - 1 and len({r[lcp] for r in rows}) == 1:
                lcp += 1
            assert lcp < MIN_SHARED_PREFIX
        if len(rows) == 1:
            assert shared == 0


def _prompts(common: int, own: list[int], seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(3, 200, (common,), generator=gen).tolist()
    return [start + torch.randint(3, 200, (n,), generator=gen).tolist() for n in own]


class _PassSpy:
    """(rows, width, cached tokens) of every forward pass of the model."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.passes: list[tuple[int, int, int]] = []
        self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids")
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        held = cache.get_seq_length() if cache is not None else 0
        if ids is not None:
            self.passes.append((ids.shape[0], ids.shape[1], held))


def _sample(sample_rows, policy, prompts, num_samples, budget, share, adapters=None, temperature=0.0):
    spy = _PassSpy(policy.model)
    try:
        out = sample_rows(policy, prompts, num_samples, budget, adapters, temperature, share, max_new=MAX_NEW)
    finally:
        spy.handle.remove()
    return out, spy.passes


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    common=st.integers(MIN_SHARED_PREFIX, 30),
    own=st.lists(st.integers(1, 12), min_size=2, max_size=5),
    budget=st.integers(8, 200),
    num_samples=st.integers(1, 3),
    mixed=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_a_shared_beginning_samples_the_same_tokens(
    lora_team, sample_rows, common, own, budget, num_samples, mixed, seed
):
    policy = lora_team[0]
    policy.model.eval()
    prompts = _prompts(common, own, seed)
    adapters = sorted(["agent_0", "agent_1"][i % 2] for i in range(len(prompts))) if mixed else None
    if adapters is None:
        policy.activate()
    whole, _ = _sample(sample_rows, policy, prompts, num_samples, budget, share=False, adapters=adapters)
    shared, passes = _sample(sample_rows, policy, prompts, num_samples, budget, share=True, adapters=adapters)
    assert torch.equal(shared.tokens, whole.tokens)
    assert torch.equal(shared.lengths, whole.lengths)
    # each run that shares a beginning encodes it once, alone and without a cache
    for _, common_tokens in shared_prefix_runs(prompts, adapters):
        if common_tokens:
            assert (1, common_tokens, 0) in passes


def test_the_cache_and_logits_match_the_whole_prompt(lora_team):
    """Keys/values the cache holds and the last logits, shared beginning vs full prompts."""
    policy = lora_team[0]
    policy.activate()
    policy.model.eval()
    prompts = _prompts(24, [3, 9, 5], seed=4)
    input_ids, mask = policy._left_pad(prompts)
    positions = padded_position_ids(mask)
    name = cache_kwarg_name(policy.model)
    got = {}
    passes = {}
    for share in (False, True):
        spy = _PassSpy(policy.model)
        with torch.no_grad():
            cache, logits, cache_mask = chunked_prefill(
                policy.model,
                input_ids,
                mask,
                positions,
                budget=10_000,
                num_samples=2,
                extra_tokens=4,
                row_adapters=None,
                forward_kwargs={name: None, "logits_to_keep": 1},
                cache_name=name,
                share_prefix=share,
            )
        spy.handle.remove()
        passes[share] = spy.passes
        got[share] = (cache, logits, cache_mask)
    assert passes[False] == [(3, 33, 0)]
    assert passes[True] == [(1, 24, 0), (3, 9, 24)]  # the beginning once, then 9 own columns on top
    (c0, l0, m0), (c1, l1, m1) = got[False], got[True]
    torch.testing.assert_close(l1, l0, rtol=1e-5, atol=1e-5)
    assert torch.equal(m0, mask) and m1.shape == mask.shape
    # row 0 has 3 own tokens: the 6 columns before them are padding of its own part
    assert m1[0].tolist() == [0] * 0 + [1] * 24 + [0] * 6 + [1] * 3
    assert torch.equal(m1.sum(dim=1), mask.sum(dim=1))  # the same tokens held, laid out differently
    for layer0, layer1 in zip(c0.layers, c1.layers, strict=True):
        for t0, t1 in ((layer0.keys, layer1.keys), (layer0.values, layer1.values)):
            for row in range(6):  # fanned out: output row 2b + s holds input row b
                held0 = t0[row][:, m0[row // 2].bool()]
                held1 = t1[row][:, m1[row // 2].bool()]
                torch.testing.assert_close(held1, held0, rtol=1e-5, atol=1e-5)


def test_prompts_that_differ_early_are_prefilled_whole(lora_team, sample_rows):
    policy = lora_team[0]
    policy.activate()
    prompts = _prompts(MIN_SHARED_PREFIX - 1, [5, 8], seed=5)
    _, passes = _sample(sample_rows, policy, prompts, 2, budget=1000, share=True)
    assert [p for p in passes if p[1] > 1] == [(2, MIN_SHARED_PREFIX - 1 + 8, 0)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_policy_call_path_shares_the_beginning(lora_team, sample_rows, temperature):
    """``sample_encoded`` (what ``generate`` runs) encodes the beginning once and samples what
    the whole prompts give."""
    policy = lora_team[0]
    policy.activate()
    prompts = _prompts(30, [4, 11, 7, 2], seed=6)
    cfg = GenerationConfig(max_new_tokens=MAX_NEW, temperature=temperature, top_k=20, prefill_token_budget=2048)
    generators = [torch.Generator().manual_seed(100 + r) for r in range(len(prompts) * 3)]
    spy = _PassSpy(policy.model)
    try:
        ids, lengths, _ = policy.sample_encoded(prompts, 3, cfg, generators)
    finally:
        spy.handle.remove()
    assert spy.passes[0] == (1, 30, 0)
    whole, _ = _sample(sample_rows, policy, prompts, 3, 2048, share=False, temperature=temperature)
    for row, (got, n) in enumerate(zip(ids, lengths, strict=True)):
        assert got[:n] == whole.tokens[row, :n].tolist() and n == int(whole.lengths[row])
