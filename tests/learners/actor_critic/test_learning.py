"""IAC learns on comlrl/Writing-v0 with the tiny random model: the critic's loss falls
and the team reward rises (fixed seeds; about 30 s on 2 CPU cores)."""

from __future__ import annotations

from learners.actor_critic import IACConfig, IACTrainer

from .conftest import ENV, base_options


def test_iac_value_head_critic_loss_falls_and_reward_rises(team, tmp_path):
    cfg = IACConfig(
        **base_options(
            tmp_path,
            num_generations=4,
            rollout_buffer_size=4,
            max_new_tokens=10,
            use_separate_critic=False,
            agent_learning_rate=2e-2,
            critic_learning_rate=3e-3,
            train_task_slice=":2",
            num_train_epochs=12,
            value_clip_range=0.2,
        )
    )
    trainer = IACTrainer(cfg, team, ENV)
    trainer.train()
    rewards = [h["turn_1/reward_mean"] for h in trainer.history if "turn_1/reward_mean" in h]
    critic_loss = [h["agent_0/critic_loss"] for h in trainer.history if "agent_0/critic_loss" in h]
    assert len(rewards) == len(critic_loss) == 24
    first, last = sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8
    assert last > first + 0.2, f"reward did not rise: {first:.3f} -> {last:.3f}"
    early, late = sum(critic_loss[:3]) / 3, sum(critic_loss[-8:]) / 8
    assert late < 0.75 * early, f"critic loss did not fall: {early:.4f} -> {late:.4f}"
