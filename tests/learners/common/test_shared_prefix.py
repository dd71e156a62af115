"""Grouped scoring with shared prompt prefixes equals scoring every row on its own:
the same log-probs and the same gradients, whatever the groups' prompts share."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from comlrl_core.models.hf_policy import TransformersPolicy
from learners.common import shared_prefix
from learners.common.shared_prefix import shared_prefix_token_logprobs


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return TransformersPolicy.from_source("tiny-random", device="cpu")


def _per_row_and_grouped(policy, prompts, comps, weights):
    flat_p = [p for p, group in zip(prompts, comps, strict=True) for _ in group]
    flat_c = [c for group in comps for c in group]
    policy.model.zero_grad(set_to_none=True)
    per_row, mask_a = policy.token_logprobs(flat_p, flat_c)
    (per_row * weights).sum().backward()
    grads_a = [p.grad.clone() for p in policy.parameters()]
    policy.model.zero_grad(set_to_none=True)
    grouped, mask_b = shared_prefix_token_logprobs(policy, prompts, comps)
    (grouped * weights).sum().backward()
    grads_b = [p.grad.clone() for p in policy.parameters()]
    policy.model.zero_grad(set_to_none=True)
    return (per_row, mask_a, grads_a), (grouped, mask_b, grads_b)


@settings(max_examples=12, deadline=None)
@given(
    common=st.integers(0, 40),
    rests=st.lists(st.integers(0, 12), min_size=2, max_size=3),
    comp_lens=st.lists(st.integers(0, 6), min_size=2, max_size=2),
    seed=st.integers(0, 1000),
)
def test_common_prefix_across_groups_changes_nothing(policy, common, rests, comp_lens, seed):
    gen = torch.Generator().manual_seed(seed)
    vocab = policy.model.config.vocab_size
    stem = torch.randint(3, vocab, (common,), generator=gen).tolist()
    prompts = [stem + torch.randint(3, vocab, (r,), generator=gen).tolist() for r in rests]
    if any(len(p) == 0 for p in prompts):
        prompts = [p or [7] for p in prompts]
    comps = [[torch.randint(3, vocab, (n,), generator=gen).tolist() for n in comp_lens] for _ in prompts]
    if all(n == 0 for n in comp_lens):
        comps[0][0] = [5]
    weights = torch.rand(len(prompts) * len(comp_lens), 1, generator=gen) + 0.5
    (a, mask_a, grads_a), (b, mask_b, grads_b) = _per_row_and_grouped(policy, prompts, comps, weights)
    assert torch.equal(mask_a, mask_b)
    assert torch.allclose(a, b, atol=1e-5)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        assert torch.allclose(ga, gb, atol=1e-4)


def test_long_common_prefix_takes_the_three_pass_route(policy, monkeypatch):
    """A prompt that is a prefix of another still keeps one token of its own."""
    calls = []
    original = policy.model.forward

    @functools.wraps(original)  # keeps the signature the cache-keyword probe reads
    def counting(*args, **kwargs):
        ids = kwargs.get("input_ids")
        calls.append(tuple(ids.shape) if ids is not None else tuple(kwargs["inputs_embeds"].shape[:2]))
        return original(*args, **kwargs)

    stem = list(range(10, 10 + shared_prefix.MIN_COMMON_PREFIX + 8))
    prompts = [stem, stem + [50, 51, 52]]
    comps = [[[5, 6], [7]], [[8, 9, 10], [11]]]
    weights = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    monkeypatch.setattr(policy.model, "forward", counting)
    (a, _, grads_a), (b, _, grads_b) = _per_row_and_grouped(policy, prompts, comps, weights)
    monkeypatch.undo()
    # per-row: one pass; grouped: common prefix (1 row), the rests but their last token
    # (2 rows), completions opened by that last prompt token (4 rows)
    assert calls[1:] == [(1, len(stem) - 2), (2, 4), (4, 3)]
    assert torch.allclose(a, b, atol=1e-5)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        assert torch.allclose(ga, gb, atol=1e-4)


def test_one_embedding_lookup_and_one_output_head_pass(policy, monkeypatch):
    """The dense vocabulary-sized work happens once per call: one embedding lookup (one
    embedding gradient) and the output head on the completion rows only."""
    embed_calls, head_rows = [], []
    embed, head = policy.model.get_input_embeddings(), policy.model.get_output_embeddings()
    h1 = embed.register_forward_hook(lambda m, a, out: embed_calls.append(out.shape))
    h2 = head.register_forward_hook(lambda m, a, out: head_rows.append(out.shape))
    stem = list(range(10, 10 + shared_prefix.MIN_COMMON_PREFIX + 8))
    prompts = [stem + [40], stem + [50, 51, 52]]
    comps = [[[5, 6], [7]], [[8, 9, 10], [11]]]
    try:
        logp, _ = shared_prefix_token_logprobs(policy, prompts, comps)
    finally:
        h1.remove()
        h2.remove()
    assert len(embed_calls) == 1
    # prompt passes keep one position per row (logits_to_keep=1); completions: 4 rows x 3
    big = [s for s in head_rows if s[-2] > 1]
    assert big == [torch.Size([4, 3, policy.model.config.vocab_size])]
    logp.sum().backward()
    assert policy.model.get_input_embeddings().weight.grad is not None
    policy.model.zero_grad(set_to_none=True)


def test_single_token_prompts_fall_back_to_the_unshifted_route(policy):
    prompts = [[7], [8, 9, 10]]
    comps = [[[5, 6], [7]], [[8, 9, 10], [11]]]
    weights = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    (a, mask_a, grads_a), (b, mask_b, grads_b) = _per_row_and_grouped(policy, prompts, comps, weights)
    assert torch.equal(mask_a, mask_b)
    assert torch.allclose(a, b, atol=1e-5)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        assert torch.allclose(ga, gb, atol=1e-4)


def test_rejects_empty_prompts(policy):
    with pytest.raises(ValueError, match="at least one token"):
        shared_prefix_token_logprobs(policy, [[1, 2], []], [[[3]], [[4]]])
