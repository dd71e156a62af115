"""optimize_batch: exact micro-batching, and where the critic's gradient goes."""

from __future__ import annotations

import random

import pytest
import torch

from learners.actor_critic.critics import ModelCritic, ValueHeadCritic
from learners.actor_critic.update import Samples, minibatches, optimize_batch


class RecordingSGD(torch.optim.SGD):
    """SGD with lr 0 that keeps a copy of every gradient it is asked to apply."""

    def __init__(self, params):
        super().__init__(list(params), lr=0.0)
        self.seen: list[list[torch.Tensor | None]] = []

    def step(self, closure=None):
        self.seen.append(
            [None if p.grad is None else p.grad.detach().clone() for g in self.param_groups for p in g["params"]]
        )
        return super().step(closure)


def _samples(policy, critic) -> Samples:
    texts = ["alpha beta", "gamma", "delta epsilon zeta", "eta"]
    s = Samples()
    for t, text in enumerate(texts):
        s.turns.append(0)
        s.prompt_ids.append(policy.encode_prompt(text))
        s.completion_ids.append(policy.tokenizer(f" word{t}", add_special_tokens=False)["input_ids"])
        s.critic_rows.append(critic.encode(text))
        s.advantages.append([1.0, -0.5, 0.25, 2.0][t])
        s.targets.append([0.3, 0.9, -0.4, 0.1][t])
        s.old_values.append(0.0)
    return s


def _grads(policy, critic, micro: int, clip: float | None = None):
    actor_opt, critic_opt = RecordingSGD(policy.parameters()), RecordingSGD(critic.trainable_parameters())
    samples = _samples(policy, critic)
    optimize_batch(
        samples,
        [0, 1, 2, 3],
        optimizers=[actor_opt, critic_opt],
        policy=policy,
        critic=critic,
        value_loss_coef=0.6,
        value_clip_range=clip,
        micro_batch_size=micro,
        max_grad_norm=None,
        step=0,
        who="agent 0",
    )
    return actor_opt.seen[0], critic_opt.seen[0]


def test_micro_batching_gives_the_same_gradient(team):
    policy = team[0]
    critic = ValueHeadCritic(policy)
    full_a, full_c = _grads(policy, critic, micro=4)
    one_a, one_c = _grads(policy, critic, micro=1)
    for a, b in zip(full_a + full_c, one_a + one_c, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)
    assert any(g.abs().sum() > 0 for g in full_c)


def test_value_head_loss_reaches_the_actor_trunk_but_a_separate_critic_does_not(team):
    policy = team[0]
    head = ValueHeadCritic(policy)
    samples = _samples(policy, head)
    samples.advantages = [0.0] * 4  # no actor signal: any actor gradient comes from the value loss
    opt = RecordingSGD(policy.parameters())
    optimize_batch(
        samples,
        [0, 1, 2, 3],
        optimizers=[opt, RecordingSGD(head.trainable_parameters())],
        policy=policy,
        critic=head,
        value_loss_coef=1.0,
        value_clip_range=None,
        micro_batch_size=4,
        max_grad_norm=None,
        step=0,
        who="a",
    )
    assert sum(float(g.abs().sum()) for g in opt.seen[0] if g is not None) > 0

    separate = ModelCritic(team[1])  # another model plays the separate critic
    samples = _samples(policy, separate)
    samples.advantages = [0.0] * 4
    opt = RecordingSGD(policy.parameters())
    optimize_batch(
        samples,
        [0, 1, 2, 3],
        optimizers=[opt, RecordingSGD(separate.trainable_parameters())],
        policy=policy,
        critic=separate,
        value_loss_coef=1.0,
        value_clip_range=None,
        micro_batch_size=4,
        max_grad_norm=None,
        step=0,
        who="a",
    )
    assert all(g is None or float(g.abs().sum()) == 0.0 for g in opt.seen[0])


def test_value_head_gradient_matches_finite_differences(team):
    """d(loss)/d(head bias) = coef * mean(2 (v - y)) for the unclipped squared error."""
    policy = team[0]
    critic = ValueHeadCritic(policy)
    samples = _samples(policy, critic)
    with torch.no_grad():
        v = critic.values(samples.critic_rows)
    expected = 0.6 * float((2 * (v - torch.tensor(samples.targets))).mean())
    _, critic_grads = _grads(policy, critic, micro=2)
    bias_grad = critic_grads[-1]  # the output layer's bias is the head's last parameter
    assert float(bias_grad) == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_minibatches_split_by_turn_then_size():
    batches = minibatches([0, 1, 0, 1, 0, 2], 2, random.Random(0))
    assert [sorted(b) for b in batches[:2]] in ([[0, 2], [4]], [[0, 4], [2]], [[2, 4], [0]])
    assert sorted(i for b in batches for i in b) == list(range(6))
    turns = [[0, 1, 0, 1, 0, 2][i] for b in batches for i in b]
    assert turns == sorted(turns)
    assert [len(b) for b in minibatches([0, 0, 0], None, random.Random(0))] == [3]
