"""What every preference trainer shares: env and team setup, pair collection from task
items, evaluation with the task reward, logging.

Subclasses (MADPO, MARLHF and their iterative forms) decide how pairs are used.
Every random draw is seeded from ``config.seed`` and a purpose tag, so runs repeat.
"""

from __future__ import annotations

import pathlib
import random
import time
from typing import Any, Callable, Sequence

from comlrl_core.policy import Policy
from comlrl_core.run.metrics import MetricsLogger
from learners.common.seeding import derive_seed
from learners.common.setup import (
    build_env,
    check_team_fits_env,
    num_tasks,
    releases_between_phases,
    team_policies,
    tune_host_memory,
)
from learners.common.trainer_utils import TrainerCommon
from learners.preference.build import pairs_within
from learners.preference.candidates import (
    Oracle,
    TaskCandidates,
    TaskRewardOracle,
    close_tasks,
    reset_tasks,
    sample_candidates,
    score_tasks,
)
from learners.preference.oracles import CallableOracle, JointOracle
from learners.preference.pref_config import PreferenceConfig
from learners.preference.records import PreferencePair

# Seed-path tags: keep the random streams of different purposes apart.
COLLECT, RESET, SELECT, SHUFFLE = 11, 12, 13, 14
COMPARATOR, REPLAY = 16, 17  # 15 was the evaluation stream's tag; kept free so seeds stay as they were


class PreferenceTrainerBase(TrainerCommon):
    """Setup shared by the preference trainers; see the subclasses."""

    algorithm_name = "Preference"
    config_class: type = PreferenceConfig

    def __init__(
        self,
        config: PreferenceConfig,
        team: Any,
        env: str | Callable[..., Any],
        *,
        logger: MetricsLogger | None = None,
        oracle: JointOracle | None = None,
    ) -> None:
        if not isinstance(config, self.config_class):
            raise TypeError(f"config must be a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config
        self._check_run_setup()  # MARLHF is not data-parallel: it refuses a multi-process launcher
        self.team = team
        self.policies: list[Policy] = team_policies(team)
        self.retain_heap = tune_host_memory(config, self.policies)
        self.release_memory = releases_between_phases(config, self.policies)
        self._env_spec = env
        self.env = self._make_env(config.train_task_slice)
        self.agent_names = self._check_team()
        self.num_tasks = num_tasks(self.env)
        self.task_oracle = TaskRewardOracle(self.agent_names)
        # what scores candidates for preferences: the user's oracle, else the task reward
        self.oracle: Oracle = self.task_oracle if oracle is None else CallableOracle(oracle)
        self._eval_env: Any = None
        self.run_dir = pathlib.Path(config.output_dir)
        self._logger = logger
        self.history: list[dict[str, float]] = []
        self.global_step = 0  # optimizer updates (per agent) so far

    # -- setup ----------------------------------------------------------------------
    def _check_team(self) -> list[str]:
        """The env's agent names, once the team fits the env (one policy per agent)."""
        return check_team_fits_env(self.policies, self.env)

    def _env_kwargs(self, task_slice: str | None) -> dict[str, Any]:
        """The env's constructor arguments for the split ``task_slice`` (one turn)."""
        return dict(num_turns=1, task_slice=task_slice, **self.config.env_kwargs)

    def _make_env(self, task_slice: str | None, env_spec: Any = None) -> Any:
        return build_env(env_spec or self._env_spec, **self._env_kwargs(task_slice))

    @property
    def logger(self) -> MetricsLogger:
        if self._logger is None:
            self._logger = self._new_logger()
        return self._logger

    def training_tasks(self) -> list[int]:
        count = self.num_tasks
        if self.config.preference_max_tasks is not None:
            count = min(count, self.config.preference_max_tasks)
        return list(range(count))

    def task_batches(self) -> list[list[int]]:
        tasks, size = self.training_tasks(), self.config.preference_task_batch_size
        return [tasks[s : s + size] for s in range(0, len(tasks), size)]

    # -- pairs ----------------------------------------------------------------------
    def owns_task_batch(self, index: int) -> bool:
        """[distributed] Whether this process collects task batch ``index`` (data-parallel
        trainers shard the batches; the others collect all of them)."""
        return True

    def sample_tasks(
        self,
        tasks: Sequence[int],
        policies: Sequence[Policy],
        num_candidates: int,
        seed_key: Sequence[int],
        oracle: Oracle,
    ) -> list[TaskCandidates]:
        """Reset, sample ``num_candidates`` joint responses per task and score them."""
        c = self.config
        batch = reset_tasks(self.env, tasks, self.agent_names, [derive_seed(c.seed, RESET, t) for t in tasks])
        sample_candidates(
            batch,
            policies,
            num_candidates,
            self.generation_config(),
            [derive_seed(c.seed, *seed_key, i) for i in range(len(policies))],
        )
        score_tasks(oracle, batch)
        return batch

    def collect_pairs(
        self, oracle: Oracle | None = None, round_index: int = 0
    ) -> tuple[list[PreferencePair], dict[str, float]]:
        """Pairs from every training task's own candidates (base trainers)."""
        c, oracle = self.config, oracle or self.oracle
        pairs: list[PreferencePair] = []
        t0, rewards, tasks_without = time.perf_counter(), [], 0
        for b, tasks in enumerate(self.task_batches()):
            if not self.owns_task_batch(b):  # [distributed] another process collects it
                continue
            batch = self.sample_tasks(
                tasks, self.policies, c.preference_num_candidates, (COLLECT, round_index, b), oracle
            )
            for task in batch:
                found = pairs_within(
                    task,
                    c.pair_selection,
                    c.preference_pairs_per_sample,
                    random.Random(derive_seed(c.seed, SELECT, round_index, task.task)),
                )
                tasks_without += not found
                pairs.extend(found)
                rewards.extend(task.scored_rewards())
            close_tasks(batch)
        stats = {
            "preference/num_pairs": float(len(pairs)),
            "preference/tasks_without_pairs": float(tasks_without),
            "preference/candidate_reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
            "time/collect_s": time.perf_counter() - t0,
        }
        return pairs, stats

    # -- evaluation and logging -----------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Evaluation episodes with the TASK reward (``eval/turn_1/reward_mean`` ...)."""
        return self._evaluate_episodes(1, 1.0)

    def plot_rewards(self) -> pathlib.Path | None:
        return self._plot_reward_curve(("turn_1/reward_mean", "eval/turn_1/reward_mean"))
