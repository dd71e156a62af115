"""Iterative MARLHF: every round compares the live policies with a comparator, stores the
round's pairs, picks a replay batch, fits a FRESH reward model on it (re-initialised from
the backbone every round) and trains the RL backend against it (run folder
``output_dir/rl/iteration_000r``; a new backend each round, so its optimizer state starts
afresh every round).

Rounds are resumable between rounds: ``train(stop_after_rounds=k)``, ``save_checkpoint()``,
and a trainer resumed from that checkpoint continues at round ``k + 1`` with the replay
buffer, the latest reward model and the policies restored (a checkpoint written inside a
round, e.g. by the backend, is not a resume point of this trainer).

``preference_scoring_reward``: ``task`` (default) scores candidates with the task reward;
``reward_model`` scores them with the most recently fitted reward model, falling back to
the task reward while none exists (round 1).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

from comlrl_core.config.options import option
from comlrl_core.run.metrics import MetricsLogger
from learners.common.setup import host_memory_managed
from learners.marlhf.marlhf_config import MARLHFConfig
from learners.marlhf.marlhf_trainer import MARLHFTrainer
from learners.marlhf.reward_env import RewardModelOracle
from learners.preference.candidates import Oracle
from learners.preference.iter_config import IterativeOptions
from learners.preference.iterative import IterativeRounds
from learners.preference.oracles import JointOracle
from learners.preference.records import PreferencePair


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
        self,
        config: MARLHFIterConfig,
        team: Any,
        env: str | Callable[..., Any],
        *,
        logger: MetricsLogger | None = None,
        oracle: JointOracle | None = None,
    ) -> None:
        super().__init__(config, team, env, logger=logger, oracle=oracle)
        self._init_rounds()

    def preference_oracle(self) -> Oracle:
        if self.config.preference_scoring_reward == "reward_model" and self.reward_model is not None:
            return RewardModelOracle(self._score_with_reward_model)
        return self.oracle

    @host_memory_managed
    def train(self, stop_after_rounds: int | None = None) -> dict[str, float]:
        """Run the remaining rounds; ``stop_after_rounds`` pauses once that many rounds are
        complete (then :meth:`save_checkpoint`, and a resumed trainer continues with the
        next round)."""
        return self.run_rounds(stop_after_rounds=stop_after_rounds)

    def train_round(self, round_: int, pairs: Sequence[PreferencePair], stop_after: int | None) -> dict[str, float]:
        """A fresh reward model on the round's pairs, then a fresh RL backend against it
        (the backend's run cannot pause: a round is the unit of resumption)."""
        self._log(self.fit_reward_model(list(pairs), round_))
        return self.train_policies(self.run_dir / "rl" / f"iteration_{round_:04d}")

    def _cursor(self) -> dict[str, Any]:
        return {**super()._cursor(), **self._rounds_cursor()}

    def _extra_files(self) -> dict[str, bytes]:
        return {**super()._extra_files(), **self._rounds_files()}

    def _restore(self, cursor: dict[str, Any], path: pathlib.Path) -> None:
        super()._restore(cursor, path)
        self._restore_rounds(cursor, path)
