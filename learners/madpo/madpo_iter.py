"""Iterative MADPO: every round compares the live policies with a comparator, stores the
round's pairs, picks a replay batch and runs ``num_train_epochs`` DPO epochs on it.

See :mod:`learners.preference.iterative` for the round, :mod:`learners.preference.comparators`
for the comparators and :mod:`learners.preference.replay` for the replay modes. Defaults
follow CoMLRL's ``MADPOIterConfig`` (20 candidates, 4 pairs per task, ``comparator_reward``
selection, 1 epoch per round).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any, Callable

from comlrl_core.config.options import option
from comlrl_core.run.metrics import MetricsLogger
from learners.madpo.madpo_config import MADPOConfig
from learners.madpo.madpo_trainer import MADPOTrainer
from learners.preference.iter_config import IterativeOptions
from learners.preference.iterative import IterativeRounds


@dataclass
class MADPOIterConfig(IterativeOptions, MADPOConfig):
    num_train_epochs: int = option(1, help="DPO epochs over each round's training pairs")
    output_dir: str = option("runs/madpo_iter", help="run folder: metrics, checkpoints, replay files")


class MADPOIterTrainer(IterativeRounds, MADPOTrainer):
    """``MADPOIterTrainer(config, team, env)``."""

    algorithm_name = "MADPOIter"
    config_class = MADPOIterConfig

    def __init__(
        self, config: MADPOIterConfig, team: Any, env: str | Callable[..., Any], *, logger: MetricsLogger | None = None
    ) -> None:
        super().__init__(config, team, env, logger=logger)
        self._init_rounds()

    def train(self, stop_after: int | None = None) -> dict[str, float]:
        """Run the remaining rounds; ``stop_after`` pauses after that many updates in total."""
        c = self.config
        if self.iteration == 0 and self.pairs is None:
            self.save_policy_checkpoint(0)
        last: dict[str, float] = {}
        while self.iteration < c.num_iterations:
            round_ = self.iteration + 1
            if self.pairs is None:
                comparator = self.build_comparator(round_)
                found, stats = self.collect_round(round_, comparator)
                self._log(stats)
                self.pairs = self.store_and_select(round_, found)
                self.round, self.epoch, self.batch_in_epoch = round_, 0, 0
            if self.pairs:
                last = self.train_on_pairs(self.pairs, stop_after=stop_after) or last
                if self.epoch < c.num_train_epochs:
                    return last  # paused mid-round
            self.save_policy_checkpoint(round_)
            self.iteration, self.pairs = round_, None
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
