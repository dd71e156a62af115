"""MADPO's learning-rate schedule (``lr_scheduler_type``) spans all its updates, is logged
per agent, and a resumed run takes its rate back from the step alone."""

from __future__ import annotations

import pytest
import torch
from magrpo_fakes import BigramPolicy, FakeTeam

from learners.madpo import MADPOTrainer

from .test_madpo_trainer import _config, _env


def _reward(t, a, turn):
    return (a["a0"] + a["a1"]).count("a") / max(1, len(a["a0"] + a["a1"]))


def _trainer(tmp_path, seeds=(1, 2)) -> MADPOTrainer:
    config = _config(tmp_path, lr_scheduler_type="linear", num_train_epochs=3)
    return MADPOTrainer(config, FakeTeam([BigramPolicy(init_seed=s) for s in seeds]), _env(_reward))


def test_linear_schedule_decays_over_every_update_and_resumes(tmp_path):
    trainer = _trainer(tmp_path)
    trainer.train(stop_after=2)
    ckpt = trainer.save_checkpoint()
    trainer.train()
    rows = [h for h in trainer.history if "loss" in h]
    total = len(rows)
    assert total >= 3
    rates = [r["agent_0/learning_rate"] for r in rows]
    assert rates == pytest.approx([0.1 * (1 - step / total) for step in range(total)])  # linear, no warm-up
    assert all(r["agent_1/grad_norm"] > 0 for r in rows)
    final = [p.logits.detach().clone() for p in trainer.policies]

    again = _trainer(tmp_path, seeds=(7, 8))
    again.resume_from_checkpoint(ckpt)
    again.train()
    for a, b in zip(final, again.policies, strict=True):
        assert torch.allclose(a, b.logits, atol=1e-6)
