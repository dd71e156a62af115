"""Actor-critics log TRL's per-model figures: learning rate (after the schedule) and
gradient norm of every actor and critic, and the agents' completion lengths."""

from __future__ import annotations

import pytest

from learners.actor_critic import MAACConfig, MAACTrainer

from .conftest import ENV, base_options


def test_actor_and_critic_rates_follow_the_schedule_and_are_logged(team, tmp_path):
    cfg = MAACConfig(
        **base_options(
            tmp_path,
            num_generations=2,
            rollout_buffer_size=2,
            train_task_slice=":2",
            num_train_epochs=2,
            max_new_tokens=2,
            lr_scheduler_type="cosine",
            warmup_ratio=0.25,  # ceil(0.25 * 4 steps) = 1 warm-up step
            agent_learning_rate=1e-4,
            critic_learning_rate=2e-4,
        )
    )
    trainer = MAACTrainer(cfg, team, ENV)
    trainer.train()
    rows = [h for h in trainer.history if "agent_0/learning_rate" in h]
    assert [r["step"] for r in rows] == [1.0, 2.0, 3.0, 4.0]
    # cosine after one warm-up step: factors 0, 1, cos(pi/3)-ish 0.75, 0.25 of each optimizer's own rate
    assert [r["agent_0/learning_rate"] for r in rows] == pytest.approx([0.0, 1e-4, 0.75e-4, 0.25e-4])
    assert [r["critic_0/learning_rate"] for r in rows] == pytest.approx([0.0, 2e-4, 1.5e-4, 0.5e-4])
    updated = [r for r in rows if "critic_0/grad_norm" in r]
    assert updated and all(r["critic_0/grad_norm"] > 0 and r["agent_1/grad_norm"] > 0 for r in updated)
    assert all(1 <= r["agent_1/completions/mean_length"] <= 2 for r in rows)
