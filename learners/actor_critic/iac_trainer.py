"""IACTrainer: independent actor-critic, one critic per agent on that agent's own text.

``IACTrainer(config, team, env, critics=None)``; ``env`` is a registered id or a factory.
Agent i's critic reads only agent i's prompt (V(h)), or its prompt and its own
response (Q(h, a)); it never sees a teammate's action except where the env itself put
it into agent i's prompt. Critics are a separate model per agent
(``use_separate_critic=True``, from ``critic_model``) or a value head on the agent's own
model. ``critics`` overrides what the config would build (one per agent).

An update round, per agent: critic estimates of every buffered turn (no gradient), TD
targets and advantages per episode (:func:`learners.actor_critic.targets.update_targets`),
then turn by turn, shuffled batches of ``train_batch_size`` samples, one step of the
actor's and the critic's optimizer per batch on
``actor_loss + value_loss_coef * critic_loss``.
"""

from __future__ import annotations

import random

from learners.actor_critic.ac_config import IACConfig
from learners.actor_critic.ac_trainer import ActorCriticTrainer, mean
from learners.actor_critic.critics import Critic, ValueHeadCritic
from learners.actor_critic.targets import update_targets
from learners.actor_critic.update import Samples, minibatches, optimize_batch
from learners.common.episodes import Episode, Turn


class IACTrainer(ActorCriticTrainer):
    algorithm_name = "IAC"
    config_class = IACConfig
    config: IACConfig

    def _build_critics(self) -> list[Critic]:
        c = self.config
        if c.use_separate_critic:
            return [self._separate_critic() for _ in self.policies]
        return [ValueHeadCritic(p, c.value_head_hidden_dim) for p in self.policies]

    def _check_critics(self, critics: list[Critic]) -> None:
        if len(critics) != len(self.policies):
            raise ValueError(f"IAC needs one critic per agent: got {len(critics)} for {len(self.policies)} agents")
        for i, critic in enumerate(critics):
            if not isinstance(critic, Critic):
                raise TypeError(f"critic {i} must be a learners.actor_critic.critics.Critic")
            on_actor = isinstance(critic, ValueHeadCritic)
            if on_actor and critic.backbone is not self.policies[i]:
                raise ValueError(f"critic {i} is a value head on another agent's model")
            if on_actor == self.config.use_separate_critic:
                want = "a separate critic (ModelCritic)" if self.config.use_separate_critic else "a ValueHeadCritic"
                raise ValueError(f"use_separate_critic={self.config.use_separate_critic} wants {want} for agent {i}")

    def critic_input(self, turn: Turn, agent: int | None) -> tuple[str, str | None]:
        if agent is None:
            raise ValueError("an IAC critic belongs to one agent; pass its index")
        mine = turn.agents[agent]
        return mine.prompt, (mine.completion if self.config.critic_type == "q" else None)

    def _agent_samples(self, agent: int, episodes: list[Episode]) -> tuple[Samples, list[list[int]]]:
        """Agent's samples (episode-major) and, per episode, the sample indices of its turns."""
        critic = self.critics[agent]
        samples = Samples()
        where: list[list[int]] = []
        for episode in episodes:
            where.append([])
            for t, turn in enumerate(episode.turns):
                where[-1].append(len(samples.turns))
                mine = turn.agents[agent]
                samples.turns.append(t)
                samples.prompt_ids.append(mine.prompt_ids)
                samples.completion_ids.append(mine.completion_ids)
                samples.critic_rows.append(critic.encode(*self.critic_input(turn, agent)))
        return samples, where

    def _update(self, episodes: list[Episode], rng: random.Random) -> dict[str, float]:
        c = self.config
        out: dict[str, float] = {}
        for agent, policy in enumerate(self.policies):
            critic = self.critics[agent]
            samples, where = self._agent_samples(agent, episodes)
            values = critic.values_nograd(samples.critic_rows, c.logprob_micro_batch_size)
            targets, advantages = update_targets(
                [e.rewards for e in episodes],
                [[values[i] for i in idx] for idx in where],
                discount=c.discount,
                critic_type=c.critic_type,
                advantage_normalization=c.advantage_normalization,
            )
            samples.old_values = values
            samples.targets = [0.0] * len(samples)
            samples.advantages = [0.0] * len(samples)
            for e, idx in enumerate(where):
                for t, i in enumerate(idx):
                    samples.targets[i] = targets[e][t]
                    samples.advantages[i] = advantages[e][t]
            results = [
                optimize_batch(
                    samples,
                    batch,
                    optimizers=[self.actor_optimizers[agent], self.critic_optimizers[agent]],
                    policy=policy,
                    critic=critic,
                    value_loss_coef=c.value_loss_coef,
                    value_clip_range=c.value_clip_range,
                    micro_batch_size=c.logprob_micro_batch_size,
                    token_budget=c.logprob_token_budget,
                    max_grad_norm=c.max_grad_norm,
                    step=self.global_step,
                    who=f"agent {agent}",
                )
                for batch in minibatches(samples.turns, c.train_batch_size, rng)
            ]
            out[f"agent_{agent}/actor_loss"] = mean([r.actor_loss for r in results])
            out[f"agent_{agent}/critic_loss"] = mean([r.value_loss for r in results])
            out[f"agent_{agent}/value_mean"] = mean(values)
            out[f"agent_{agent}/target_mean"] = mean(samples.targets)
            out[f"agent_{agent}/optimizer_steps"] = float(len(results))
        return out
