"""MARLHFIterTrainer resumes between rounds: the same end state as an uninterrupted run."""

from __future__ import annotations

import torch
from preference_fakes import FakeTeam, TextBigram, a_fraction, env_factory

from learners.marlhf import MARLHFIterConfig, MARLHFIterTrainer


def _trainer(tmp_path, seeds=(1, 2)) -> MARLHFIterTrainer:
    config = MARLHFIterConfig(
        num_iterations=2,
        preference_num_candidates=4,
        preference_pairs_per_sample=2,
        # round 2 scores its candidates with round 1's reward model: a resume that lost the
        # reward model would collect different pairs
        preference_scoring_reward="reward_model",
        preference_replay_mode="all_history",
        max_new_tokens=3,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        eval_interval=0,
        agent_learning_rate=0.1,
        output_dir=str(tmp_path / "run"),
        progress_bar=False,
        seed=3,
        reward_model_name="tiny-random",
        reward_model_device="cpu",
        reward_learning_rate=1e-3,
        reward_num_train_epochs=1,
        num_generations=2,
        max_steps=2,
    )
    team = FakeTeam([TextBigram(init_seed=seeds[0]), TextBigram(init_seed=seeds[1])])
    return MARLHFIterTrainer(config, team, env_factory(a_fraction))


def _reward_model_state(trainer: MARLHFIterTrainer) -> dict[str, torch.Tensor]:
    assert trainer.reward_model is not None
    return {k: v.detach().clone() for k, v in trainer.reward_model.state_dict().items()}


def test_resume_after_round_one_equals_an_uninterrupted_run(tmp_path):
    full = _trainer(tmp_path / "full")
    full.train()
    assert full.iteration == 2 and full.finished

    part = _trainer(tmp_path / "part")
    part.train(stop_after_rounds=1)
    assert part.iteration == 1 and not part.finished and part.pairs is None
    round_one_model = _reward_model_state(part)
    ckpt = part.save_checkpoint()

    # different initial weights: everything that matters must come from the checkpoint
    resumed = _trainer(tmp_path / "part", seeds=(8, 9))
    resumed.resume_from_checkpoint(ckpt)
    assert resumed.iteration == 1 and resumed.global_step == part.global_step
    assert [(r.iteration, r.num_pairs) for r in resumed.replay.rounds] == [
        (r.iteration, r.num_pairs) for r in full.replay.rounds[:1]
    ]
    for key, value in _reward_model_state(resumed).items():
        assert torch.equal(value, round_one_model[key]), key
    for a, b in zip(part.policies, resumed.policies, strict=True):
        assert torch.equal(a.logits, b.logits)

    resumed.train()
    assert resumed.iteration == 2 and resumed.finished
    assert resumed.global_step == full.global_step > part.global_step
    assert [(r.iteration, r.num_pairs) for r in resumed.replay.rounds] == [
        (r.iteration, r.num_pairs) for r in full.replay.rounds
    ]
    full_model, resumed_model = _reward_model_state(full), _reward_model_state(resumed)
    for key, value in full_model.items():
        assert torch.allclose(value, resumed_model[key], atol=1e-6), key
    for a, b in zip(full.policies, resumed.policies, strict=True):
        assert torch.allclose(a.logits, b.logits, atol=1e-6)
    assert not torch.allclose(full.policies[0].logits, TextBigram(init_seed=1).logits)  # training moved them
