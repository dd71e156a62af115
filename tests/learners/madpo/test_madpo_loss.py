"""The MADPO loss: exact values, gradient routing through each agent's own margin, and
the last-token option."""

from __future__ import annotations

import math

import pytest
import torch
from magrpo_fakes import BigramPolicy

from learners.madpo.madpo_loss import agent_losses, drop_last_real_token, madpo_update, pair_margins
from learners.preference.records import PreferencePair


def test_loss_value_is_exact():
    m0, m1 = torch.tensor([2.0, -1.0]), torch.tensor([0.5, 0.25])
    losses = agent_losses([m0, m1], beta=0.1)
    expected = [-math.log(1 / (1 + math.exp(-0.1 * d))) for d in (2.5, -0.75)]
    for loss in losses:
        assert loss.tolist() == pytest.approx(expected, rel=1e-6)


def test_each_agent_gradient_flows_only_through_its_own_margin():
    m0 = torch.tensor([1.0, -2.0], requires_grad=True)
    m1 = torch.tensor([0.5, 3.0], requires_grad=True)
    l0, l1 = agent_losses([m0, m1], beta=0.1)
    assert torch.autograd.grad(l0.sum(), m1, allow_unused=True)[0] is None  # others detached
    assert torch.autograd.grad(l1.sum(), m0, allow_unused=True)[0] is None
    (l0.sum() + l1.sum()).backward()
    delta = torch.tensor([1.5, 1.0])
    expected = -0.1 * torch.sigmoid(-0.1 * delta)  # d/dm_i of -log sigmoid(beta * Delta)
    assert m0.grad.tolist() == pytest.approx(expected.tolist(), rel=1e-6)
    assert m1.grad.tolist() == pytest.approx(expected.tolist(), rel=1e-6)


def test_drop_last_real_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float)
    assert drop_last_real_token(mask).tolist() == [[1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]


def _pair(w0, l0, w1, l1) -> PreferencePair:
    return PreferencePair(
        prompts=["ab", "cd"],
        winner_completions=["x", "y"],
        loser_completions=["u", "v"],
        winner_reward=1.0,
        loser_reward=0.0,
        candidate_reward_mean=0.5,
        prompt_ids=[[1, 2], [3, 4]],
        winner_ids=[w0, w1],
        loser_ids=[l0, l1],
    )


def test_margins_count_every_token_or_all_but_the_last():
    policy = BigramPolicy(init_seed=4)
    prompt, win, lose = [[1, 2]], [[3, 4, 0]], [[5, 0]]
    full = pair_margins(policy, prompt, win, lose)
    logp_w = policy.sequence_logprobs(prompt, win)
    logp_l = policy.sequence_logprobs(prompt, lose)
    assert full.item() == pytest.approx((logp_w - logp_l).item(), rel=1e-6)
    short = pair_margins(policy, prompt, win, lose, exclude_last_token=True)
    assert short.item() == pytest.approx(
        (policy.sequence_logprobs(prompt, [[3, 4]]) - policy.sequence_logprobs(prompt, [[5]])).item(), rel=1e-6
    )


def test_update_moves_only_the_trained_direction_and_micro_batching_agrees():
    pairs = [_pair([3, 4, 0], [5, 0], [2, 0], [1, 1, 0]), _pair([1, 0], [3, 3], [4, 0], [5, 0])]
    results = []
    for micro in (1, 2):
        pols = [BigramPolicy(init_seed=1), BigramPolicy(init_seed=2)]
        opts = [torch.optim.SGD(p.parameters(), lr=0.5) for p in pols]
        before = [
            pair_margins(
                p, [q.prompt_ids[i] for q in pairs], [q.winner_ids[i] for q in pairs], [q.loser_ids[i] for q in pairs]
            ).detach()
            for i, p in enumerate(pols)
        ]
        out = madpo_update(pols, opts, pairs, beta=0.1, micro_batch_size=micro)
        after = [
            pair_margins(
                p, [q.prompt_ids[i] for q in pairs], [q.winner_ids[i] for q in pairs], [q.loser_ids[i] for q in pairs]
            ).detach()
            for i, p in enumerate(pols)
        ]
        assert (sum(after) > sum(before)).all()  # the joint margin grows on every pair
        results.append((out.loss, [p.logits.detach().clone() for p in pols]))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-6)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        assert torch.allclose(a, b, atol=1e-6)
