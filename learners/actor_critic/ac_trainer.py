"""The training loop shared by IACTrainer and MAACTrainer.

One training step = one task item: play ``num_generations`` complete episodes on it
(:func:`learners.common.episodes.collect_episodes`), push them into the episode buffer,
and run an update round when the buffer holds ``rollout_buffer_size`` episodes. The
buffer is flushed at the end of every epoch (and of training). Updates happen only
between task items, so the policy never changes between the turns of one episode.

Subclasses build the critics (``_build_critics``), say what a critic reads
(``critic_input``) and run an update round (``_update``). Every random draw is seeded
from ``config.seed`` and the step, so a resumed run continues like an uninterrupted one.
"""

from __future__ import annotations

import json
import pathlib
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from comlrl_core.models.cpu.memory_stats import end_of_phase, host_memory_metrics
from comlrl_core.run.checkpoint import checkpoint_path, read_extra_file, save_checkpoint
from comlrl_core.run.metrics import MetricsLogger
from comlrl_core.run.seeds import torch_seeded
from learners.actor_critic.ac_config import ActorCriticConfig
from learners.actor_critic.critics import Critic, ModelCritic
from learners.actor_critic.episode_buffer import EpisodeBuffer
from learners.actor_critic.targets import discounted_returns
from learners.common.episodes import Episode, collect_episodes
from learners.common.optim import adamw, adamw_settings
from learners.common.seeding import derive_seed
from learners.common.setup import (
    build_env,
    check_team_fits_env,
    num_tasks,
    releases_between_phases,
    team_policies,
    tune_host_memory,
)
from learners.common.trainer_utils import (
    TaskItemTraining,
    TrainerCommon,
    agent_entries,
    checkpoint_keep_last,
    load_own_checkpoint,
    planned_items,
    shuffled_task,
)

# Seed-path tags: keep the random streams of different purposes apart.
_ROLLOUT, _SHUFFLE, _ORDER, _EVAL, _CRITIC_INIT = 1, 3, 4, 5, 6


@dataclass(frozen=True)
class UpdateRecord:
    """When an update round ran: after ``global_step`` task items (1-based), with
    ``episodes_collected`` episodes played so far, on ``num_episodes`` of them."""

    global_step: int
    episodes_collected: int
    num_episodes: int
    reason: str  # "buffer_full" | "epoch_end"


class ActorCriticTrainer(TaskItemTraining, TrainerCommon):
    """Base of IAC / MAAC; see the subclasses for the constructor arguments."""

    algorithm_name = "ActorCritic"
    config_class: type = ActorCriticConfig

    def __init__(
        self,
        config: ActorCriticConfig,
        team: Any,
        env: str | Callable[..., Any],
        *,
        critics: list[Critic] | None = None,
        logger: MetricsLogger | None = None,
    ) -> None:
        if not isinstance(config, self.config_class):
            raise TypeError(f"config must be a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config
        self._check_run_setup()  # not data-parallel: refuses a multi-process launcher
        self.team = team
        self.policies = team_policies(team)
        self.retain_heap = tune_host_memory(config, self.policies)
        self.release_memory = releases_between_phases(config, self.policies)
        self._env_spec = env
        self.env = self._make_env(config.train_task_slice)
        self.agent_names = check_team_fits_env(self.policies, self.env)
        self.num_tasks = num_tasks(self.env)
        self._eval_env: Any = None
        self.actor_optimizers = []
        for i, policy in enumerate(self.policies):
            params = [p for p in policy.parameters() if p.requires_grad]
            if not params:
                raise ValueError(
                    f"agent {i} ({policy.name}) has no trainable parameters; {self.algorithm_name} trains every agent"
                )
            self.actor_optimizers.append(adamw(params, lr=config.agent_learning_rate, **adamw_settings(config)))
        if critics is None:
            with torch_seeded(derive_seed(config.seed, _CRITIC_INIT)):  # new heads: the same in every run
                critics = self._build_critics()
        self.critics = list(critics)
        self._check_critics(self.critics)
        self.critic_optimizers = [
            adamw(c.trainable_parameters(), lr=config.resolved_critic_learning_rate, **adamw_settings(config))
            for c in self.critics
        ]
        self.buffer = EpisodeBuffer(config.rollout_buffer_size)
        self.global_step = 0
        self.episodes_collected = 0
        self.update_rounds = 0
        self.update_log: list[UpdateRecord] = []
        self.run_dir = pathlib.Path(config.output_dir)
        self._logger = logger
        self.history: list[dict[str, float]] = []

    # -- to be provided by subclasses ---------------------------------------------------
    def _build_critics(self) -> list[Critic]:
        raise NotImplementedError

    def _check_critics(self, critics: list[Critic]) -> None:
        raise NotImplementedError

    def critic_input(self, turn: Any, agent: int | None) -> tuple[str, str | None]:
        """``(history, action or None)`` the critic reads for one turn (agent: IAC only)."""
        raise NotImplementedError

    def _update(self, episodes: list[Episode], rng: random.Random) -> dict[str, float]:
        raise NotImplementedError

    # -- setup ----------------------------------------------------------------------
    def _env_kwargs(self, task_slice: str | None) -> dict[str, Any]:
        """The env's constructor arguments for the split ``task_slice``."""
        c = self.config
        extra = {"external_prompt_passthrough": True} if c.external_prompt_passthrough else {}
        return dict(
            num_turns=c.num_turns,
            early_termination_threshold=c.early_termination_threshold,
            task_slice=task_slice,
            **extra,
            **c.env_kwargs,
        )

    def _make_env(self, task_slice: str | None) -> Any:
        return build_env(self._env_spec, **self._env_kwargs(task_slice))

    def _separate_critic(self) -> ModelCritic:
        """A new critic model from ``critic_model`` (default: agent 0's model source)."""
        c = self.config
        source = c.critic_model
        if source is None:
            src = getattr(self.policies[0], "source", None)
            source = getattr(src, "spec", None)
            if source is None:
                raise ValueError(
                    "set critic_model (a model source) or pass critics=...: agent 0 "
                    "does not say which model it was loaded from"
                )
        spec: dict[str, Any] = {
            "lora": c.lora,
            "lora_r": c.lora_r,
            "lora_alpha": c.lora_alpha,
            "lora_dropout": c.lora_dropout,
        }
        if c.device is not None:
            spec["device"] = c.device
        return ModelCritic.from_source(source, c.critic_value_head_hidden_dim, **spec)

    @property
    def logger(self) -> MetricsLogger:
        if self._logger is None:
            self._logger = self._new_logger()
        return self._logger

    @property
    def total_steps(self) -> int:
        return planned_items(self.config.num_train_epochs, self.num_tasks, self.config.max_steps)

    def task_for_step(self, step: int) -> int:
        return shuffled_task(step, self.num_tasks, self.config.shuffle_tasks, self.config.seed, _ORDER)

    # -- training -------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """One task item: episodes, buffer, maybe an update round. Returns its metrics."""
        c, step = self.config, self.global_step
        t0 = time.perf_counter()
        task = self.task_for_step(step)
        self.team_train(False)
        episodes = collect_episodes(
            self.env,
            [task],
            self.policies,
            self.agent_names,
            num_turns=c.num_turns,
            num_generations=c.num_generations,
            generation_config=self.generation_config(),
            seed=derive_seed(c.seed, _ROLLOUT, step),
            record_joint_state=self._needs_joint_state(),
        )
        end_of_phase()
        t1 = time.perf_counter()
        for episode in episodes:
            self.buffer.add(episode)
        self.episodes_collected += len(episodes)
        self.global_step = step + 1
        metrics = self._rollout_metrics(episodes)
        if self.buffer.ready:
            metrics.update(self._update_round("buffer_full"))
        epoch_end = self.global_step % self.num_tasks == 0 or self.global_step == self.total_steps
        if epoch_end and len(self.buffer):  # no episode waits across an epoch boundary
            metrics.update(self._update_round("epoch_end"))
        metrics.update(
            {
                "train/task": float(task),
                "time/rollout_s": t1 - t0,
                "time/update_s": time.perf_counter() - t1,
                "time/step_s": time.perf_counter() - t0,
            }
        )
        metrics.update(host_memory_metrics())  # before the release: what the allocator kept shows
        end_of_phase()
        if self.global_step % c.logging_steps == 0:
            self._log(metrics)
        return metrics

    def _needs_joint_state(self) -> bool:
        return False

    def team_train(self, mode: bool) -> None:
        for p in self.policies:
            if hasattr(p, "train"):
                p.train(mode)
        for critic in self.critics:
            critic.train(mode)

    def _update_round(self, reason: str) -> dict[str, float]:
        episodes = self.buffer.drain()
        if not episodes:
            return {}
        rng = random.Random(derive_seed(self.config.seed, _SHUFFLE, self.update_rounds))
        self.update_rounds += 1
        self.update_log.append(UpdateRecord(self.global_step, self.episodes_collected, len(episodes), reason))
        self.team_train(True)
        try:
            metrics = self._update(episodes, rng)
        finally:
            self.team_train(False)
        metrics["train/update_rounds"] = float(self.update_rounds)
        return metrics

    def _rollout_metrics(self, episodes: list[Episode]) -> dict[str, float]:
        out: dict[str, float] = {}
        for t in range(self.config.num_turns):
            reached = [e for e in episodes if len(e) > t]
            if not reached:
                continue
            out[f"turn_{t + 1}/reward_mean"] = sum(e.turns[t].reward for e in reached) / len(reached)
            rets = [discounted_returns(e.rewards, self.config.discount)[t] for e in reached]
            out[f"turn_{t + 1}/expected_return"] = sum(rets) / len(rets)
        return out

    def _finish(self) -> None:
        if len(self.buffer):
            self._log(self._update_round("epoch_end"))
        if self.config.eval_interval:
            self.evaluate()
        self.save_checkpoint()
        self.plot_rewards()

    def plot_rewards(self) -> pathlib.Path | None:
        """``reward_curve.png`` in the run folder (skipped without matplotlib)."""
        return self._plot_reward_curve(f"turn_{t}/reward_mean" for t in range(1, self.config.num_turns + 1))

    # -- evaluation -----------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Run ``eval_num_samples`` evaluation tasks (one episode each) and log ``eval/...``."""
        c = self.config
        return self._evaluate_episodes(c.num_turns, c.discount, prepare=lambda: self.team_train(False))

    # -- checkpoints ----------------------------------------------------------------
    def _checkpoint_objects(self) -> tuple[dict[str, Any], dict[str, Any]]:
        savables: dict[str, Any] = agent_entries(self.policies)
        savables.update({f"critic_{i}": c for i, c in enumerate(self.critics)})
        optimizers: dict[str, Any] = agent_entries(self.actor_optimizers)
        optimizers.update({f"critic_{i}": o for i, o in enumerate(self.critic_optimizers)})
        return savables, optimizers

    def save_checkpoint(self, directory: str | pathlib.Path | None = None) -> pathlib.Path:
        """Actors, critics, optimizers, the episode buffer and counters, atomically
        (default: ``output_dir/checkpoints/checkpoint-<step>``)."""
        path = directory or checkpoint_path(self.run_dir / "checkpoints", self.global_step)
        savables, optimizers = self._checkpoint_objects()
        cursor = {
            "algorithm": self.algorithm_name,
            "global_step": self.global_step,
            "episodes_collected": self.episodes_collected,
            "update_rounds": self.update_rounds,
        }
        buffer = json.dumps(self.buffer.to_list()).encode()
        return save_checkpoint(
            path,
            policies=savables,
            optimizers=optimizers,
            cursor=cursor,
            extra_files={"episode_buffer.json": buffer},
            keep_last=checkpoint_keep_last(self.config, path),  # save_total_limit
        )

    def resume_from_checkpoint(self, directory: str | pathlib.Path | None = None) -> pathlib.Path:
        """Restore a checkpoint (default: the latest complete one under ``output_dir``)."""
        savables, optimizers = self._checkpoint_objects()
        path, cursor = load_own_checkpoint(
            self.run_dir, directory, self.algorithm_name, policies=savables, optimizers=optimizers
        )
        self.global_step = int(cursor["global_step"])
        self.episodes_collected = int(cursor["episodes_collected"])
        self.update_rounds = int(cursor["update_rounds"])
        self.buffer.load_list(json.loads(read_extra_file(path, "episode_buffer.json")))
        return path


def mean(values: Sequence[float | None]) -> float:
    """Mean of one step's figures (nan when there are none).

    A None is a figure of a part the step did not update (e.g. the actor loss of a
    critic-only batch): averaging it is a bug, so it raises rather than being skipped.
    """
    known = [v for v in values if v is not None]
    if len(known) != len(values):
        raise ValueError("mean() got a None figure: the step did not update the part it reports")
    return sum(known) / len(known) if known else float("nan")


__all__ = ["ActorCriticTrainer", "UpdateRecord", "mean"]
