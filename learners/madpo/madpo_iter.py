"""Iterative MADPO: every round compares the live policies with a comparator, stores the
round's pairs, picks a replay batch and runs ``num_train_epochs`` DPO epochs on it.

The round loop is :meth:`learners.preference.iterative.IterativeRounds.run_rounds`; a run
paused inside a round (``train(stop_after=...)``) resumes at the same update. See
:mod:`learners.preference.iterative` for the round, :mod:`learners.preference.comparators`
for the comparators and :mod:`learners.preference.replay` for the replay modes. Defaults
follow CoMLRL's ``MADPOIterConfig`` (20 candidates, 4 pairs per task, ``comparator_reward``
selection, 1 epoch per round).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from comlrl_core.config.options import ConfigError, option
from comlrl_core.run.metrics import MetricsLogger
from learners.common.setup import host_memory_managed
from learners.madpo.madpo_config import MADPOConfig
from learners.madpo.madpo_trainer import MADPOTrainer
from learners.preference.iter_config import IterativeOptions
from learners.preference.iterative import IterativeRounds
from learners.preference.oracles import JointOracle
from learners.preference.records import PreferencePair


@dataclass
class MADPOIterConfig(IterativeOptions, MADPOConfig):
    num_train_epochs: int = option(1, help="DPO epochs over each round's training pairs")
    output_dir: str = option("runs/madpo_iter", help="run folder: metrics, checkpoints, replay files")

    def validate(self) -> None:
        super().validate()
        if self.generation_mode != "decentralized":
            raise ConfigError(
                "MADPOIterConfig trains a decentralized target (generation_mode='decentralized'); a "
                "centralized writer belongs to the comparator: comparator_generation_mode='centralized'",
                "generation_mode",
            )


class MADPOIterTrainer(IterativeRounds, MADPOTrainer):
    """``MADPOIterTrainer(config, team, env)``."""

    algorithm_name = "MADPOIter"
    config_class = MADPOIterConfig

    def __init__(
        self,
        config: MADPOIterConfig,
        team: Any,
        env: str | Callable[..., Any],
        *,
        logger: MetricsLogger | None = None,
        oracle: JointOracle | None = None,
    ) -> None:
        super().__init__(config, team, env, logger=logger, oracle=oracle)
        self._init_rounds()

    @host_memory_managed
    def train(self, stop_after: int | None = None, stop_after_rounds: int | None = None) -> dict[str, float]:
        """Run the remaining rounds; ``stop_after`` pauses after that many updates in total
        (inside a round), ``stop_after_rounds`` once that many rounds are complete."""
        return self.run_rounds(stop_after, stop_after_rounds)

    def begin_round(self, round_: int) -> None:
        self.round, self.epoch, self.batch_in_epoch = round_, 0, 0

    def train_round(self, round_: int, pairs: Sequence[PreferencePair], stop_after: int | None) -> dict[str, float]:
        return self.train_on_pairs(pairs, stop_after=stop_after)

    def round_complete(self) -> bool:
        return self.epoch >= self.config.num_train_epochs

    def _cursor(self) -> dict[str, Any]:
        return {**super()._cursor(), **self._rounds_cursor()}

    def _extra_files(self) -> dict[str, bytes]:
        return {**super()._extra_files(), **self._rounds_files()}

    def _restore(self, cursor: dict[str, Any], path: pathlib.Path) -> None:
        super()._restore(cursor, path)
        self._restore_rounds(cursor, path)
