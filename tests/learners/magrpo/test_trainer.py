"""MAGRPOTrainer with contract-following fakes: buffers, updates, guards, eval, resume."""

from __future__ import annotations

import json
import math

import pytest
import torch
from magrpo_fakes import BigramPolicy, CountingEnv, FakeTeam

from learners.magrpo import MAGRPOConfig, MAGRPOTrainer, MAREINFORCETrainer, MAReMaxTrainer, MARLOOTrainer
from learners.magrpo.losses import NonFiniteLossError


def _a_fraction(task, actions, turn):
    text = actions["a0"] + actions["a1"]
    return text.count("a") / max(1, len(text))


def _config(tmp_path, **kw):
    base = dict(
        num_generations=4,
        num_turns=1,
        max_new_tokens=4,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        eval_interval=0,
        agent_learning_rate=0.1,
        output_dir=str(tmp_path / "run"),
        progress_bar=False,
        seed=3,
    )
    base.update(kw)
    return MAGRPOConfig(**base)


def _trainer(tmp_path, cls=MAGRPOTrainer, policies=None, reward_fn=_a_fraction, counter=None, **kw):
    policies = policies or [BigramPolicy(init_seed=1), BigramPolicy(init_seed=2)]
    factory = lambda **env_kw: CountingEnv(reward_fn=reward_fn, counter=counter, **env_kw)  # noqa: E731
    return cls(_config(tmp_path, **kw), FakeTeam(policies), factory)


def test_buffer_and_batch_sizes_set_the_number_of_updates(tmp_path):
    # T=2 aligned, G=4: 1 + 4 = 5 node groups per agent per task.
    tr = _trainer(tmp_path, num_turns=2, rollout_buffer_size=2, train_batch_size=1, max_steps=2)
    tr.train()
    # 10 groups per agent; flushes of 2 (split by turn, one group per step) -> 10 updates each
    assert tr.update_counts == [10, 10]
    tr2 = _trainer(tmp_path, num_turns=2, rollout_buffer_size=5, train_batch_size=None, max_steps=2)
    tr2.train()
    # flush of 5 = 1 turn-1 group + 4 turn-2 groups, batch 5 -> 2 updates per flush
    assert tr2.update_counts == [4, 4]


def test_training_raises_the_reward(tmp_path):
    tr = _trainer(tmp_path, num_train_epochs=8, rollout_buffer_size=1)
    tr.train()
    rewards = [h["turn_1/reward_mean"] for h in tr.history if "turn_1/reward_mean" in h]
    assert sum(rewards[-8:]) / 8 > sum(rewards[:8]) / 8 + 0.15
    assert all(math.isfinite(h["agent_0/loss"]) for h in tr.history if "agent_0/loss" in h)


def test_env_receives_turns_and_threshold_and_metrics_are_logged(tmp_path):
    counter = {"steps": 0, "batches": 0, "clones": 0, "resets": 0}
    tr = _trainer(
        tmp_path,
        counter=counter,
        num_turns=2,
        early_termination_threshold=2.0,
        max_steps=3,
        eval_interval=2,
        eval_num_samples=3,
    )
    assert tr.env.num_turns == 2 and tr.env.threshold == 2.0
    tr.train()
    assert counter["steps"] >= 3 * (4 + 16)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if "turn_2/reward_mean" in x]
    evals = [x for x in lines if "eval/turn_1/reward_mean" in x]
    assert len(train) == 3 and {"turn_1/expected_return", "agent_1/loss"} <= set(train[0])
    assert [e["step"] for e in evals] == [0, 2, 3]  # every 2 steps, and at the end
    assert "eval/turn_2/reward_mean" in evals[0]
    assert (tmp_path / "run" / "reward_curve.png").stat().st_size > 0


def test_logprobs_are_micro_batched(tmp_path):
    pol = [BigramPolicy(init_seed=1), BigramPolicy(init_seed=2)]
    tr = _trainer(tmp_path, policies=pol, rollout_buffer_size=3, max_steps=3, logprob_micro_batch_size=5)
    tr.train()
    # one flush of 3 groups x 4 responses = 12 sequences -> passes of 5, 5, 2
    assert pol[0].logprob_calls == [5, 5, 2]


def test_groups_with_nothing_to_learn_are_counted_and_not_scored(tmp_path):
    pol = [BigramPolicy(init_seed=1), BigramPolicy(init_seed=2)]
    constant = lambda task, actions, turn: 1.0  # noqa: E731  every group ties: zero advantages
    tr = _trainer(tmp_path, policies=pol, reward_fn=constant, rollout_buffer_size=1, max_steps=2)
    tr.train()
    assert pol[0].logprob_calls == [] and pol[1].logprob_calls == []  # no forward at all
    assert tr.update_counts == [2, 2]  # yet every update stepped
    rows = [h for h in tr.history if "agent_0/updates" in h]
    assert [h["agent_0/zero_advantage_frac"] for h in rows] == [1.0, 1.0]
    pol = [BigramPolicy(init_seed=1), BigramPolicy(init_seed=2)]
    tr = _trainer(tmp_path, policies=pol, rollout_buffer_size=1, max_steps=2)  # rewards that differ
    tr.train()
    fractions = [h["agent_0/zero_advantage_frac"] for h in tr.history if "agent_0/updates" in h]
    assert fractions and max(fractions) < 1.0 and pol[0].logprob_calls


class UnderflowingScorer(BigramPolicy):
    """Samples like a BigramPolicy; scores through a low-precision round trip that
    underflows, so every log-prob (hence the loss) is -inf while sampling stays valid."""

    def token_logprobs(self, prompt_ids, completion_ids):
        lp, mask = super().token_logprobs(prompt_ids, completion_ids)
        return torch.log(torch.exp(lp * 1e4)) / 1e4, mask


def test_nonfinite_loss_raises_naming_step_and_agent(tmp_path):
    pol = [BigramPolicy(init_seed=1), UnderflowingScorer(init_seed=2)]
    before = [p.logits.detach().clone() for p in pol]
    tr = _trainer(tmp_path, policies=pol, rollout_buffer_size=1, max_steps=2)
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss \((-inf|inf|nan)\) at step 0 for agent 1"):
        tr.train()
    assert pol[1].generate_calls and pol[1].logprob_calls  # it sampled, then its loss was scored
    assert tr.update_counts == [1, 0]  # agent 0 stepped; the guard stopped agent 1 before its step
    assert not torch.equal(pol[0].logits.detach(), before[0])
    assert torch.equal(pol[1].logits.detach(), before[1]) and pol[1].logits.grad is None


def test_nonfinite_loss_skipped_and_counted(tmp_path):
    class NaNLogprobs(BigramPolicy):
        def token_logprobs(self, prompt_ids, completion_ids):
            lp, mask = super().token_logprobs(prompt_ids, completion_ids)
            return lp * float("nan"), mask

    pol = [BigramPolicy(init_seed=1), NaNLogprobs(init_seed=2)]
    before = pol[1].logits.detach().clone()
    tr = _trainer(tmp_path, policies=pol, rollout_buffer_size=1, max_steps=2)
    with pytest.raises(NonFiniteLossError, match=r"step 0 for agent 1"):
        tr.train()
    pol = [BigramPolicy(init_seed=1), NaNLogprobs(init_seed=2)]
    tr = _trainer(tmp_path, policies=pol, rollout_buffer_size=1, max_steps=2, skip_nonfinite=True)
    tr.train()
    assert tr.skipped_nonfinite == [0, 2] and tr.update_counts == [2, 0]
    assert torch.equal(pol[1].logits.detach(), before)
    assert tr.history[-1]["agent_1/skipped_nonfinite"] == 2.0


def test_reference_kl_is_measured_and_grows(tmp_path):
    tr = _trainer(tmp_path, rollout_buffer_size=1, max_steps=6, reference_kl_coef=0.05)
    tr.train()
    kls = [h["agent_0/kl"] for h in tr.history if "agent_0/kl" in h]
    assert kls[0] == pytest.approx(0.0, abs=1e-6)  # first update: policy == reference
    assert kls[-1] > 1e-4 and all(k >= 0 for k in kls)


def test_baseline_trainers_use_their_mode_and_reject_another(tmp_path):
    assert _trainer(tmp_path, cls=MAREINFORCETrainer).advantage_mode == "raw"
    assert _trainer(tmp_path, cls=MARLOOTrainer).advantage_mode == "rloo"
    assert _trainer(tmp_path, cls=MAReMaxTrainer).advantage_mode == "max"
    assert _trainer(tmp_path, advantage_mode="max").advantage_mode == "max"
    with pytest.raises(ValueError, match="MARLOOTrainer uses advantage_mode='rloo'"):
        _trainer(tmp_path, cls=MARLOOTrainer, advantage_mode="mean")


def test_the_four_trainers_update_differently(tmp_path):
    finals, advantages = [], []
    for cls in (MAGRPOTrainer, MAREINFORCETrainer, MARLOOTrainer, MAReMaxTrainer):
        pol = [BigramPolicy(init_seed=1), BigramPolicy(init_seed=2)]
        trainer = _trainer(tmp_path / cls.__name__, cls=cls, policies=pol, rollout_buffer_size=1, max_steps=2)
        trainer.train()
        finals.append(pol[0].logits.detach().clone())
        advantages.append([row["agent_0/advantage_abs_mean"] for row in trainer.history])
    # the same rollouts (same seeds), different baselines: different advantages at every step
    for i in range(4):
        for j in range(i + 1, 4):
            assert all(a != pytest.approx(b) for a, b in zip(advantages[i], advantages[j], strict=True))
    # ...and different weights, except mean vs leave-one-out: with groups of one size G the
    # leave-one-out advantage is G / (G - 1) times the mean-baseline one, and Adam's update
    # does not change when every gradient is scaled by one constant
    for i, j in [(0, 1), (0, 3), (1, 2), (1, 3), (2, 3)]:
        assert not torch.allclose(finals[i], finals[j])
    assert advantages[2] == pytest.approx([a * 4 / 3 for a in advantages[0]])


def test_team_must_fit_the_env(tmp_path):
    with pytest.raises(ValueError, match="2 agents"):
        _trainer(tmp_path, policies=[BigramPolicy()])


@pytest.mark.parametrize("buffer_size", [1, 3])
def test_resume_equals_uninterrupted(tmp_path, buffer_size):
    straight = [BigramPolicy(init_seed=1), BigramPolicy(init_seed=2)]
    _trainer(tmp_path / "a", policies=straight, num_turns=2, rollout_buffer_size=buffer_size, max_steps=4).train()
    first = [BigramPolicy(init_seed=1), BigramPolicy(init_seed=2)]
    tr = _trainer(tmp_path / "b", policies=first, num_turns=2, rollout_buffer_size=buffer_size, max_steps=4)
    tr.train(stop_after=2)
    ckpt = tr.save_checkpoint()
    resumed = [BigramPolicy(init_seed=7), BigramPolicy(init_seed=8)]  # fresh weights, overwritten
    tr2 = _trainer(tmp_path / "b", policies=resumed, num_turns=2, rollout_buffer_size=buffer_size, max_steps=4)
    assert tr2.resume_from_checkpoint() == ckpt and tr2.global_step == 2
    tr2.train()
    for a, b in zip(straight, resumed, strict=True):
        assert torch.equal(a.logits.detach(), b.logits.detach())


def test_tasks_per_step_builds_the_trees_of_several_items_together(tmp_path):
    counter = {"steps": 0, "batches": 0, "clones": 0, "resets": 0}
    one = [BigramPolicy(init_seed=1), BigramPolicy(init_seed=2)]
    tr = _trainer(tmp_path / "k3", policies=one, counter=counter, num_turns=2, tasks_per_step=3, max_steps=5)
    assert tr.total_steps == 2  # 5 items, 3 per step
    tr.train()
    # items 0..4 each reset once; a step's trees share one env batch and one sampling call per level
    assert counter["resets"] == 5 and counter["batches"] == 2 * 2
    assert [len(c) for c in one[0].generate_calls] == [2] * 4
    assert [n for n, _ in one[0].generate_calls] == [3, 12, 2, 8]  # nodes of a level: 3 trees x (1, 4)
    logged = [h for h in tr.history if "rollout/trees" in h]
    assert [h["rollout/trees"] for h in logged] == [3.0, 2.0]
    assert [h["turn_2/num_nodes"] for h in logged] == [12.0, 8.0]
    assert [h["train/task"] for h in logged] == [0.0, 3.0]


def test_tasks_per_step_samples_each_item_as_alone_before_the_first_update(tmp_path):
    # a buffer large enough that nothing updates inside the first step: the step's groups
    # are exactly those of the same items trained one per step
    def groups_seen(trainer):
        seen = []
        trainer._flush = lambda agent: seen.append([g.completion_ids for g in trainer.buffers[agent]])  # type: ignore
        trainer.train_step()
        return [[g.completion_ids for g in buf] for buf in trainer.buffers]

    together = _trainer(tmp_path / "a", num_turns=2, tasks_per_step=2, rollout_buffer_size=100, max_steps=4)
    apart = _trainer(tmp_path / "b", num_turns=2, tasks_per_step=1, rollout_buffer_size=100, max_steps=4)
    got = groups_seen(together)
    apart.train_step()
    expected = groups_seen(apart)
    assert got == expected and len(got[0]) == 2 * 5
