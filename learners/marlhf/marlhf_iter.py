"""Iterative MARLHF: every round compares the live policies with a comparator, stores the
round's pairs, picks a replay batch, fits a FRESH reward model on it (re-initialised from
the backbone every round) and trains the RL backend against it (run folder
``output_dir/rl/iteration_000r``; a new backend each round, so its optimizer state starts
afresh every round).

``preference_scoring_reward``: ``task`` (default) scores candidates with the task reward;
``reward_model`` scores them with the most recently fitted reward model, falling back to
the task reward while none exists (round 1).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any, Callable, Literal

from comlrl_core.config.options import option
from comlrl_core.run.metrics import MetricsLogger
from learners.marlhf.marlhf_config import MARLHFConfig
from learners.marlhf.marlhf_trainer import MARLHFTrainer
from learners.marlhf.reward_env import RewardModelOracle
from learners.preference.candidates import Oracle
from learners.preference.iter_config import IterativeOptions
from learners.preference.iterative import IterativeRounds


@dataclass
class MARLHFIterConfig(IterativeOptions, MARLHFConfig):
    num_train_epochs: int = option(2, help="RL passes over the training tasks, per round")
    reward_num_train_epochs: int = option(2, help="Bradley-Terry epochs per round")
    preference_scoring_reward: Literal["task", "reward_model"] = option(
        "task", help="what scores candidates: the task reward, or the latest reward model"
    )
    output_dir: str = option("runs/marlhf_iter", help="run folder: metrics, checkpoints, replay files, rl/")


class MARLHFIterTrainer(IterativeRounds, MARLHFTrainer):
    algorithm_name = "MARLHFIter"
    config_class = MARLHFIterConfig

    def __init__(
        self, config: MARLHFIterConfig, team: Any, env: str | Callable[..., Any], *, logger: MetricsLogger | None = None
    ) -> None:
        super().__init__(config, team, env, logger=logger)
        self._init_rounds()

    def preference_oracle(self) -> Oracle:
        if self.config.preference_scoring_reward == "reward_model" and self.reward_model is not None:
            return RewardModelOracle(self._score_with_reward_model)
        return self.task_oracle

    def train(self) -> dict[str, float]:
        """Run the remaining rounds (resumable between rounds)."""
        c = self.config
        if self.iteration == 0:
            self.save_policy_checkpoint(0)
        last: dict[str, float] = {}
        while self.iteration < c.num_iterations:
            round_ = self.iteration + 1
            comparator = self.build_comparator(round_)
            found, stats = self.collect_round(round_, comparator)
            self._log(stats)
            selected = self.store_and_select(round_, found)
            if selected:
                self._log(self.fit_reward_model(selected, round_))
                last = self.train_policies(self.run_dir / "rl" / f"iteration_{round_:04d}") or last
            self.save_policy_checkpoint(round_)
            self.iteration = round_
        if not self.finished:
            self._finish()
        return last

    def _cursor(self) -> dict[str, Any]:
        return {**super()._cursor(), **self._rounds_cursor()}

    def _extra_files(self) -> dict[str, bytes]:
        return {**super()._extra_files(), **self._rounds_files()}

    def _restore(self, cursor: dict[str, Any], path: pathlib.Path) -> None:
        super()._restore(cursor, path)
        self._restore_rounds(cursor, path)
