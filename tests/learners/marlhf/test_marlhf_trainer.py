"""MARLHFTrainer / MARLHFIterTrainer with fake policies and the tiny reward model."""

from __future__ import annotations

import pytest
import torch
from preference_fakes import FakeTeam, TextBigram, a_fraction, clear_preference, env_factory

from comlrl_core.config.options import ConfigError
from learners.marlhf import MARLHFConfig, MARLHFIterConfig, MARLHFIterTrainer, MARLHFTrainer


def _kw(tmp_path, **kw):
    base = dict(
        preference_num_candidates=4,
        preference_pairs_per_sample=2,
        max_new_tokens=3,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        eval_interval=1,
        eval_num_samples=2,
        agent_learning_rate=0.1,
        output_dir=str(tmp_path / "run"),
        progress_bar=False,
        seed=3,
        reward_model_name="tiny-random",
        reward_model_device="cpu",
        reward_learning_rate=1e-3,
        num_generations=2,
        max_steps=2,
    )
    base.update(kw)
    return base


@pytest.mark.parametrize(
    "kw,option",
    [
        (dict(rl_algorithm="ppo"), "rl_algorithm"),
        (dict(num_turns=2), "num_turns"),
        (dict(rl_algorithm="maac", reference_kl_coef=0.1), "reference_kl_coef"),
        (dict(rl_algorithm="magrpo", num_generations=1), "num_generations"),
    ],
)
def test_config_errors(kw, option):
    with pytest.raises(ConfigError, match=option):
        MARLHFConfig(**kw)


@pytest.mark.parametrize("algo", ["magrpo", "mareinforce", "marloo", "maremax", "iac", "maac"])
def test_backend_trains_on_reward_model_scores_and_evaluates_on_task_reward(tmp_path, algo):
    actor_critic = algo in ("iac", "maac")
    extra = (
        dict(num_generations=1, rl_kwargs={"critic_model": "tiny-random", "rollout_buffer_size": 1})
        if actor_critic
        else {}
    )
    cfg = MARLHFConfig(**_kw(tmp_path, rl_algorithm=algo, **extra))
    pols = [TextBigram(init_seed=1), TextBigram(init_seed=2)]
    before = [p.logits.detach().clone() for p in pols]
    trainer = MARLHFTrainer(cfg, FakeTeam(pols), env_factory(a_fraction))
    trainer.train()
    assert trainer.reward_model is not None and not any(p.requires_grad for p in trainer.reward_model.parameters())
    assert any("reward_model/accuracy" in h for h in trainer.history)
    assert any(not torch.equal(b, p.logits) for b, p in zip(before, pols, strict=True))  # the backend updated the team
    # during RL the team reward is the reward model's score ...
    env = trainer.backend.env
    env.reset(options={"task": 0})
    obs, rewards, *_rest, infos = env.step({"a0": "aaa", "a1": "b"})
    prompts = ["task0 turn1 a0", "task0 turn1 a1"]
    expected = trainer.reward_model.score_joint([(prompts, ["aaa", "b"])])[0]
    assert rewards["a0"] == pytest.approx(expected, abs=1e-5)
    assert infos["a0"]["task_reward"] == pytest.approx(0.75)
    # ... while every evaluation reports the task reward (a_fraction lies in [0, 1])
    evals = [h for h in trainer.backend.history if "eval/turn_1/reward_mean" in h]
    evals += [h for h in trainer.history if "eval/turn_1/reward_mean" in h]
    assert evals and all(0.0 <= h["eval/turn_1/reward_mean"] <= 1.0 for h in evals)
    assert trainer.reward_switch.enabled


def test_no_pairs_no_reward_model_no_update(tmp_path):
    pols = [TextBigram(init_seed=1), TextBigram(init_seed=2)]
    trainer = MARLHFTrainer(MARLHFConfig(**_kw(tmp_path)), FakeTeam(pols), env_factory(lambda t, a, turn: 0.5))
    assert trainer.train() == {}
    assert trainer.reward_model is None and trainer.backend is None


def test_iterative_reward_model_scoring_falls_back_to_the_task_reward(tmp_path):
    cfg = MARLHFIterConfig(
        **_kw(
            tmp_path,
            num_iterations=2,
            preference_scoring_reward="reward_model",
            reward_num_train_epochs=1,
            eval_interval=0,
        )
    )
    trainer = MARLHFIterTrainer(
        cfg, FakeTeam([TextBigram(init_seed=1), TextBigram(init_seed=2)]), env_factory(a_fraction)
    )
    oracles = []
    real = trainer.preference_oracle
    trainer.preference_oracle = lambda: oracles.append(real()) or oracles[-1]
    models = []
    fit = trainer.fit_reward_model
    trainer.fit_reward_model = lambda pairs, r=0: (models.append(r), fit(pairs, r))[1]
    trainer.train()
    assert type(oracles[0]).__name__ == "TaskRewardOracle"  # round 1: no reward model yet
    assert type(oracles[1]).__name__ == "RewardModelOracle"
    assert models == [1, 2]  # a fresh reward model every round
    assert (tmp_path / "run" / "rl" / "iteration_0002").is_dir()


def test_reference_kl_options_reach_the_magrpo_backend_with_the_reference_on_its_device(tmp_path):
    from learners.common.reference import DeviceReference

    cfg = MARLHFConfig(**_kw(tmp_path, reference_kl_enabled=True, reference_kl_coef=0.05, reference_devices="cpu"))
    assert cfg.reference_devices == ["cpu"]  # CoMLRL's single-string form
    pols = [TextBigram(init_seed=1), TextBigram(init_seed=2)]
    trainer = MARLHFTrainer(cfg, FakeTeam(pols), env_factory(a_fraction))
    backend = trainer.build_backend(tmp_path / "rl")
    assert backend.config.reference_kl_coef == 0.05
    refs = backend.reference_policies
    assert len(refs) == 2 and all(isinstance(r, DeviceReference) for r in refs)
    for ref, live in zip(refs, pols, strict=True):
        assert ref.reference is not live and torch.equal(ref.reference.logits, live.logits)
        assert not ref.reference.logits.requires_grad
        logp, _ = ref.token_logprobs([[1, 2]], [[3, 0]])
        want, _ = live.token_logprobs([[1, 2]], [[3, 0]])
        assert torch.allclose(logp, want.detach())


def test_reference_kl_enabled_false_turns_the_term_off(tmp_path):
    cfg = MARLHFConfig(**_kw(tmp_path, reference_kl_enabled=False, reference_kl_coef=0.05))
    assert cfg.effective_reference_kl_coef == 0.0
    trainer = MARLHFTrainer(cfg, FakeTeam([TextBigram(init_seed=1), TextBigram(init_seed=2)]), env_factory(a_fraction))
    assert trainer.backend_config(tmp_path / "rl").reference_kl_coef == 0.0
    # off, so an actor-critic backend (no reference term) accepts the copied options
    MARLHFConfig(rl_algorithm="iac", reference_kl_enabled=False, reference_kl_coef=0.05)
    with pytest.raises(ConfigError, match="reference_kl_coef"):
        MARLHFConfig(reference_kl_enabled=True, reference_kl_coef=0.0)


@pytest.mark.parametrize("algo", ["magrpo", "iac"])
def test_backend_evaluates_as_many_episodes_per_task_as_marlhf(tmp_path, algo):
    """The backend's evaluation (before RL) and MARLHF's final one play the same
    (task, sample) episodes, so a before / after comparison can pair them."""
    extra = {} if algo == "magrpo" else dict(num_generations=1, rl_kwargs={"critic_model": "tiny-random"})
    cfg = MARLHFConfig(**_kw(tmp_path, rl_algorithm=algo, eval_episodes_per_task=3, eval_k=[1, 2], **extra))
    trainer = MARLHFTrainer(cfg, FakeTeam([TextBigram(init_seed=1), TextBigram(init_seed=2)]), env_factory(a_fraction))
    backend = trainer.backend_config(tmp_path / "rl")
    assert backend.eval_episodes_per_task == 3
    assert list(backend.eval_k) == [1, 2]


def test_fitting_the_reward_model_is_seeded_and_leaves_the_global_random_stream_alone(tmp_path):
    cfg = MARLHFConfig(**_kw(tmp_path, reward_num_train_epochs=1))
    trainer = MARLHFTrainer(cfg, FakeTeam([TextBigram(init_seed=1), TextBigram(init_seed=2)]), env_factory(a_fraction))
    pairs = [clear_preference(i) for i in range(3)]
    torch.manual_seed(123)
    expected = torch.rand(4)  # the caller's stream, had nothing drawn or reseeded it
    torch.manual_seed(123)
    trainer.fit_reward_model(pairs, 1)
    assert torch.equal(torch.rand(4), expected)
    first = {k: v.clone() for k, v in trainer.reward_model.state_dict().items()}
    torch.manual_seed(999)  # another global state: the round's seed alone decides the model
    trainer.fit_reward_model(pairs, 1)
    second = trainer.reward_model.state_dict()
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    trainer.fit_reward_model(pairs, 2)  # another round: another initialisation
    assert any(not torch.equal(first[k], v) for k, v in trainer.reward_model.state_dict().items())
