"""Micro-batch planning of the log-prob passes: whole units, row cap, token budget."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from magrpo_fakes import BigramPolicy

from comlrl_core.models.tokens import plan_chunks
from learners.common.logprobs import accumulate_gradients, sequence_logprobs_nograd
from learners.magrpo.losses import sequence_pg_loss


@settings(max_examples=200, deadline=None)
@given(
    widths=st.lists(st.integers(1, 50), max_size=30),
    unit_rows=st.integers(1, 4),
    max_rows=st.integers(1, 12),
    budget=st.one_of(st.none(), st.integers(1, 200)),
)
def test_chunks_cover_every_row_once_in_whole_units_within_both_limits(widths, unit_rows, max_rows, budget):
    chunks = plan_chunks(widths, unit_rows, max_rows, budget)
    rows = [r for chunk in chunks for r in chunk]
    assert rows == list(range(len(widths) * unit_rows))
    for chunk in chunks:
        assert len(chunk) > 0 and chunk.start % unit_rows == 0 and len(chunk) % unit_rows == 0
        units = [widths[u] for u in range(chunk.start // unit_rows, chunk.stop // unit_rows)]
        if len(units) > 1:  # a lone unit may exceed either limit; a shared chunk may not
            assert len(chunk) <= max_rows
            assert budget is None or len(units) * max(units) <= budget


@settings(max_examples=100, deadline=None)
@given(widths=st.lists(st.integers(1, 50), min_size=1, max_size=30), max_rows=st.integers(1, 12))
def test_chunks_are_as_large_as_the_limits_allow(widths, max_rows):
    # without a budget, every chunk but the last is full
    chunks = plan_chunks(widths, 1, max_rows, None)
    assert all(len(c) == max_rows for c in chunks[:-1])


def test_the_budget_counts_padded_tokens():
    # 3 rows of 10, 10 and 30 tokens: 2 x 10 fits 25, a third row pads all to 30 (90 > 25)
    assert plan_chunks([10, 10, 30], 1, 16, 25) == [range(0, 2), range(2, 3)]
    # groups of 2 rows: units of width 20 each, budget 40 takes two units (4 rows)
    assert plan_chunks([20, 20, 20], 2, 16, 40) == [range(0, 4), range(4, 6)]


@pytest.mark.parametrize("budget", [1, 3, 6, None])
def test_a_token_budget_changes_the_chunks_not_the_gradient(budget):
    prompts = [[1], [2, 3], [3], [1, 4, 4], [2]]
    comps = [[2, 0], [3], [1, 1, 0], [], [4, 0]]
    coef = torch.tensor([0.5, -1.0, 2.0, 1.0, 0.25])
    full = BigramPolicy(vocab=5)
    logp, mask = full.token_logprobs(prompts, comps)
    sequence_pg_loss(logp, mask, coef).backward()
    chunked = BigramPolicy(vocab=5)
    total = accumulate_gradients(
        chunked,
        prompts,
        comps,
        lambda lp, m, idx: sequence_pg_loss(lp, m, coef[list(idx)]),
        micro_batch_size=16,
        token_budget=budget,
    )
    assert torch.allclose(full.logits.grad, chunked.logits.grad, atol=1e-6)
    assert total == pytest.approx(sequence_pg_loss(logp, mask, coef).item(), rel=1e-5)
    widths = [len(p) + len(c) for p, c in zip(prompts, comps, strict=True)]
    if budget is not None:  # each call held one row, or rows whose padded size fits the budget
        start = 0
        for size in chunked.logprob_calls:
            assert size == 1 or size * max(widths[start : start + size]) <= budget
            start += size
    else:
        assert chunked.logprob_calls == [5]


def test_nograd_log_probs_honour_the_token_budget():
    policy = BigramPolicy(vocab=5)
    out = sequence_logprobs_nograd(policy, [[1], [2], [3]], [[2, 3, 0], [4], [1]], micro_batch_size=8, token_budget=4)
    assert [t.numel() for t in out] == [3, 1, 1]
    assert policy.logprob_calls == [1, 2]
