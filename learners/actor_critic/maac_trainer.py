"""MAACTrainer: multi-agent actor-critic with one centralized critic.

``MAACTrainer(config, team, env, critics=None)``; ``env`` is a registered id or a factory.
The critic reads the joint history: ``env.state()`` before the step (every agent's
prompts and responses so far), or every agent's prompt joined when the env has no
``state``; for Q(h, a) it also reads every agent's action of that turn. ``critics``
overrides the critic the config would build (a list with one :class:`ModelCritic`).

An update round: the critic's estimates of every buffered turn (no gradient), TD
targets and one advantage per (episode, turn) shared by all agents, then turn by turn,
shuffled batches of ``train_batch_size``: one actor step per agent per batch, and one
critic step per batch on ``value_loss_coef * critic_loss``.
"""

from __future__ import annotations

import random

from learners.actor_critic.ac_config import MAACConfig
from learners.actor_critic.ac_trainer import ActorCriticTrainer, mean
from learners.actor_critic.critics import Critic, ModelCritic
from learners.actor_critic.targets import update_targets
from learners.actor_critic.update import Samples, minibatches, optimize_batch
from learners.common.episodes import Episode, Turn


def joint_action_text(agent_names: list[str], turn: Turn) -> str:
    return "\n".join(f"## {name} action\n{a.completion}" for name, a in zip(agent_names, turn.agents, strict=True))


class MAACTrainer(ActorCriticTrainer):
    algorithm_name = "MAAC"
    config_class = MAACConfig
    config: MAACConfig

    def _build_critics(self) -> list[Critic]:
        return [self._separate_critic()]

    def _check_critics(self, critics: list[Critic]) -> None:
        if len(critics) != 1 or not isinstance(critics[0], ModelCritic):
            raise ValueError("MAAC uses exactly one centralized critic: critics=[ModelCritic(...)]")

    @property
    def critic(self) -> ModelCritic:
        critic = self.critics[0]
        if not isinstance(critic, ModelCritic):  # _check_critics ran at construction
            raise TypeError(f"MAAC's critic must be a ModelCritic, got {type(critic).__name__}")
        return critic

    def _needs_joint_state(self) -> bool:
        return True

    def critic_input(self, turn: Turn, agent: int | None = None) -> tuple[str, str | None]:
        action = joint_action_text(self.agent_names, turn) if self.config.critic_type == "q" else None
        return turn.joint_state, action

    def _update(self, episodes: list[Episode], rng: random.Random) -> dict[str, float]:
        c = self.config
        joint = Samples()
        where: list[list[int]] = []
        for episode in episodes:
            where.append([])
            for t, turn in enumerate(episode.turns):
                where[-1].append(len(joint.turns))
                joint.turns.append(t)
                joint.critic_rows.append(self.critic.encode(*self.critic_input(turn)))
        values = self.critic.values_nograd(joint.critic_rows, c.logprob_micro_batch_size)
        targets, advantages = update_targets(
            [e.rewards for e in episodes],
            [[values[i] for i in idx] for idx in where],
            discount=c.discount,
            critic_type=c.critic_type,
            advantage_normalization=c.advantage_normalization,
        )
        joint.old_values = values
        joint.targets = [y for ys in targets for y in ys]  # episode-major, like the samples
        joint.advantages = [a for adv in advantages for a in adv]

        out: dict[str, float] = {}
        batches = minibatches(joint.turns, c.train_batch_size, rng)
        for agent, policy in enumerate(self.policies):
            mine = Samples(
                turns=joint.turns,
                advantages=joint.advantages,
                prompt_ids=[t.agents[agent].prompt_ids for e in episodes for t in e.turns],
                completion_ids=[t.agents[agent].completion_ids for e in episodes for t in e.turns],
            )
            results = [
                optimize_batch(
                    mine,
                    batch,
                    optimizers=[self.actor_optimizers[agent]],
                    policy=policy,
                    value_loss_coef=c.value_loss_coef,
                    value_clip_range=c.value_clip_range,
                    micro_batch_size=c.logprob_micro_batch_size,
                    token_budget=c.logprob_token_budget,
                    max_grad_norm=c.max_grad_norm,
                    step=self.global_step,
                    who=f"agent {agent}",
                )
                for batch in batches
            ]
            out[f"agent_{agent}/actor_loss"] = mean([r.actor_loss for r in results])
        critic_results = [
            optimize_batch(
                joint,
                batch,
                optimizers=[self.critic_optimizers[0]],
                critic=self.critic,
                value_loss_coef=c.value_loss_coef,
                value_clip_range=c.value_clip_range,
                micro_batch_size=c.logprob_micro_batch_size,
                token_budget=c.logprob_token_budget,
                max_grad_norm=c.max_grad_norm,
                step=self.global_step,
                who="the centralized critic",
            )
            for batch in batches
        ]
        out["critic/loss"] = mean([r.value_loss for r in critic_results])
        out["critic/value_mean"] = mean(values)
        out["critic/target_mean"] = mean(joint.targets)
        out["critic/optimizer_steps"] = float(len(critic_results))
        return out
