"""MADPOTrainer: config errors, no pairs -> no update, records, and a learning test on the
writing environment with the tiny model."""

from __future__ import annotations

import copy

import pytest
import torch
from magrpo_fakes import BigramPolicy, CountingEnv, FakeTeam

from comlrl_core.config.options import ConfigError
from learners.madpo import MADPOConfig, MADPOTrainer
from learners.preference.candidates import reset_tasks, sample_candidates, score_tasks


@pytest.mark.parametrize(
    "kw,option",
    [
        (dict(num_turns=2), "num_turns"),
        (dict(joint_mode="cross"), "joint_mode"),
        (dict(pair_selection="all"), "preference_pairs_per_sample"),
        (dict(pair_selection="comparator_reward"), "pair_selection"),
        (dict(preference_num_candidates=1), "preference_num_candidates"),
        (dict(dpo_beta=0.0), "dpo_beta"),
    ],
)
def test_config_errors_name_the_option(kw, option):
    with pytest.raises(ConfigError, match=option):
        MADPOConfig(**kw)


def _config(tmp_path, **kw):
    base = dict(
        preference_num_candidates=4,
        preference_pairs_per_sample=2,
        max_new_tokens=3,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        num_train_epochs=2,
        train_batch_size=2,
        eval_interval=0,
        agent_learning_rate=0.1,
        output_dir=str(tmp_path / "run"),
        progress_bar=False,
        seed=1,
    )
    base.update(kw)
    return MADPOConfig(**base)


def _env(reward_fn, counter=None):
    return lambda **kw: CountingEnv(
        reward_fn=reward_fn, num_tasks=3, counter=counter, **{k: v for k, v in kw.items() if k == "num_turns"}
    )


def test_no_pairs_means_no_update(tmp_path):
    pols = [BigramPolicy(init_seed=1), BigramPolicy(init_seed=2)]
    before = [p.logits.detach().clone() for p in pols]
    trainer = MADPOTrainer(_config(tmp_path), FakeTeam(pols), _env(lambda t, a, turn: 1.0))  # every candidate ties
    assert trainer.train() == {}
    assert trainer.pairs == [] and trainer.global_step == 0
    assert all(torch.equal(a, p.logits) for a, p in zip(before, pols, strict=True))
    assert any(h.get("preference/num_pairs") == 0.0 for h in trainer.history)


def test_pairs_metrics_and_resume(tmp_path):
    def reward(t, a, turn):
        return (a["a0"] + a["a1"]).count("a") / max(1, len(a["a0"] + a["a1"]))

    counter = {"steps": 0, "batches": 0, "clones": 0, "resets": 0}
    trainer = MADPOTrainer(
        _config(tmp_path), FakeTeam([BigramPolicy(init_seed=1), BigramPolicy(init_seed=2)]), _env(reward, counter)
    )
    trainer.train(stop_after=2)
    assert counter["batches"] == 1  # all 3 tasks x 4 candidates scored in one step_many call
    pairs = trainer.pairs
    assert pairs and all(p.winner_reward > p.loser_reward for p in pairs)
    assert all(len(p.winner_completions) == 2 for p in pairs)
    ckpt = trainer.save_checkpoint()
    trainer.train()
    rows = [h for h in trainer.history if "loss" in h]
    assert all(r["turn_1/reward_mean"] == r["turn_1/expected_return"] for r in rows)
    final = [p.logits.detach().clone() for p in trainer.policies]

    again = MADPOTrainer(
        _config(tmp_path), FakeTeam([BigramPolicy(init_seed=7), BigramPolicy(init_seed=8)]), _env(reward)
    )
    again.resume_from_checkpoint(ckpt)
    assert [p.to_record() for p in again.pairs] == [p.to_record() for p in pairs]
    again.train()
    assert again.global_step == trainer.global_step
    for a, b in zip(final, again.policies, strict=True):
        assert torch.allclose(a, b.logits, atol=1e-6)


def test_madpo_raises_the_win_rate_on_writing(tmp_path):
    """DPO on the writing env's own preferences: fresh samples of the trained team beat the
    initial team's (same tasks, same seeds) more often than they lose, and score higher."""
    from comlrl_core.models.agent_spec import AgentSpec
    from comlrl_core.models.team import Team
    from comlrl_core.models.tiny import tiny_model_path

    torch.manual_seed(0)
    team = Team.from_specs([AgentSpec(tiny_model_path(), device="cpu", use_chat_template=False)] * 2)
    short = lambda p: p[:60]  # noqa: E731 -- short prompts keep the test fast
    cfg = MADPOConfig(
        preference_num_candidates=8,
        preference_pairs_per_sample=4,
        preference_max_tasks=8,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        max_new_tokens=4,
        num_train_epochs=6,
        train_batch_size=8,
        eval_interval=0,
        agent_learning_rate=3e-3,
        save_final_checkpoint=False,
        seed=0,
        progress_bar=False,
        output_dir=str(tmp_path / "run"),
        env_kwargs={"expansion_ratio": 1.0, "formatters": {"summarizer": short, "expander": short}},
    )
    trainer = MADPOTrainer(cfg, team, "comlrl/Writing-v0")
    initial = copy.deepcopy(trainer.policies)

    def fresh_rewards(policies):
        # 4 draws of 8 candidates per task (seed pairs fixed): enough samples that the
        # comparison is about the training, not about one random stream
        rewards = []
        for seeds in ([555, 556], [557, 558], [559, 560], [561, 562]):
            tasks = reset_tasks(trainer.env, range(8), trainer.agent_names, [1] * 8)
            sample_candidates(tasks, policies, 8, trainer.generation_config(), seeds)
            score_tasks(trainer.task_oracle, tasks)
            rewards += [r for t in tasks for r in t.scored_rewards()]
        return rewards

    before = fresh_rewards(initial)
    trainer.train()
    after = fresh_rewards(trainer.policies)
    wins = sum(a > b for a, b in zip(after, before, strict=True)) / len(after)
    losses = sum(a < b for a, b in zip(after, before, strict=True)) / len(after)
    assert wins > losses + 0.15
    assert sum(after) / len(after) > sum(before) / len(before)
    accuracy = [h["preference/accuracy"] for h in trainer.history if "preference/accuracy" in h]
    assert accuracy[-1] == 1.0 and accuracy[0] < 1.0


@pytest.mark.parametrize("config_cls", ["MADPOConfig", "MADPOIterConfig"])
def test_madpo_accepts_and_ignores_the_reference_kl_options(config_cls):
    import learners.madpo as madpo

    cfg = getattr(madpo, config_cls).from_dict(
        {"reference_kl_enabled": True, "reference_kl_coef": 0.1, "reference_devices": "cuda:1"}
    )
    assert cfg.reference_devices == ["cuda:1"]
    assert cfg.effective_reference_kl_coef == 0.0  # MADPO's loss has no reference term
