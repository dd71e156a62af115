"""MADPOIterTrainer: rounds, replay files, and resume (replay index and files restored)."""

from __future__ import annotations

import json

import torch
from preference_fakes import FakeTeam, TextBigram, a_fraction, env_factory

from learners.madpo import MADPOIterConfig, MADPOIterTrainer


def _config(tmp_path, **kw):
    base = dict(
        num_iterations=3,
        preference_num_candidates=4,
        preference_pairs_per_sample=2,
        max_new_tokens=3,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        num_train_epochs=1,
        train_batch_size=2,
        eval_interval=0,
        agent_learning_rate=0.1,
        output_dir=str(tmp_path / "run"),
        progress_bar=False,
        seed=5,
        preference_replay_mode="lambda_decay",
        preference_replay_lambda=0.5,
        preference_replay_sample_size=5,
    )
    base.update(kw)
    return MADPOIterConfig(**base)


def _team(a=1, b=2):
    return FakeTeam([TextBigram(init_seed=a), TextBigram(init_seed=b)])


def test_rounds_write_files_and_resume_equals_uninterrupted(tmp_path):
    full = MADPOIterTrainer(_config(tmp_path / "a"), _team(), env_factory(a_fraction, 4))
    full.train()
    assert full.iteration == 3
    replay = tmp_path / "a" / "run" / "preference_replay"
    files = sorted(p.name for p in replay.iterdir())
    assert files == ["iteration_0001.json", "iteration_0002.json", "iteration_0003.json"]
    for i, name in enumerate(files, start=1):
        payload = json.loads((replay / name).read_text())
        assert payload["iteration"] == i and payload["num_pairs"] == len(payload["pairs"])
    train_sizes = [h["iter/train_preference_pairs"] for h in full.history if "iter/train_preference_pairs" in h]
    assert train_sizes == [5.0, 5.0, 5.0]

    part = MADPOIterTrainer(_config(tmp_path / "b"), _team(), env_factory(a_fraction, 4))
    part.train(stop_after=4)  # pauses inside round 2 (3 updates per round)
    ckpt = part.save_checkpoint()
    (tmp_path / "b" / "run" / "preference_replay" / "iteration_0001.json").write_text("{}")  # damaged meanwhile
    resumed = MADPOIterTrainer(_config(tmp_path / "b"), _team(8, 9), env_factory(a_fraction, 4))
    resumed.resume_from_checkpoint(ckpt)
    assert [(r.iteration, r.num_pairs) for r in resumed.replay.rounds] == [
        (r.iteration, r.num_pairs) for r in full.replay.rounds[:2]
    ]
    resumed.train()
    assert resumed.global_step == full.global_step and resumed.iteration == 3
    for a, b in zip(full.policies, resumed.policies, strict=True):
        assert torch.allclose(a.logits, b.logits, atol=1e-6)


def test_pause_between_rounds_resumes_at_the_next_round(tmp_path):
    # the round loop is shared with MARLHFIterTrainer (learners.preference.iterative.run_rounds)
    full = MADPOIterTrainer(_config(tmp_path / "a"), _team(), env_factory(a_fraction, 4))
    full.train()
    part = MADPOIterTrainer(_config(tmp_path / "b"), _team(), env_factory(a_fraction, 4))
    part.train(stop_after_rounds=1)
    assert part.iteration == 1 and part.pairs is None and not part.finished
    ckpt = part.save_checkpoint()
    resumed = MADPOIterTrainer(_config(tmp_path / "b"), _team(8, 9), env_factory(a_fraction, 4))
    resumed.resume_from_checkpoint(ckpt)
    assert resumed.iteration == 1 and resumed.global_step == part.global_step
    resumed.train()
    assert resumed.iteration == 3 and resumed.global_step == full.global_step
    for a, b in zip(full.policies, resumed.policies, strict=True):
        assert torch.allclose(a.logits, b.logits, atol=1e-6)
