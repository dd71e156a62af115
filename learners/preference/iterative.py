"""The iterative preference loop shared by MADPOIterTrainer and MARLHFIterTrainer.

Each of ``num_iterations`` rounds:

1. **collect** -- the target (live) policies sample ``preference_num_candidates`` joint
   responses per training task, the comparator samples ``comparator_num_candidates``
   (default the same), the oracle scores both sides, and same-index comparisons become
   pairs (:func:`learners.preference.build.pairs_against`);
2. **store** -- the round's pairs go to ``preference_replay_dir/iteration_000r.json``;
3. **select** -- the replay buffer picks the round's training pairs
   (:mod:`learners.preference.replay`);
4. **train** -- the subclass trains on them (DPO steps; or a fresh reward model + RL).

With ``comparator_policy='history'`` the policies are checkpointed automatically before
the first round and after every round (``policy_checkpoint_dir/iteration_000r``).

The class is a mixin over :class:`learners.preference.trainer_base.PreferenceTrainerBase`;
:meth:`IterativeRounds.run_rounds` is the round loop of both iterative trainers. A
subclass provides :meth:`~IterativeRounds.train_round` (and may replace
``preference_oracle()``); it keeps the round's training pairs in ``self.pairs`` (None
between rounds) and saves ``self.iteration`` and the replay buffer with its checkpoints
(:meth:`~IterativeRounds._rounds_cursor`), so a run paused between rounds -- or, where
``train_round`` can pause, inside one -- resumes where it stopped.
"""

from __future__ import annotations

import pathlib
import random
import time
from typing import TYPE_CHECKING, Any, Sequence

from comlrl_core.policy import GenerationConfig, Policy
from comlrl_core.run.checkpoint import load_checkpoint, read_extra_file, save_checkpoint
from learners.common.seeding import derive_seed
from learners.preference.build import pairs_against
from learners.preference.candidates import Oracle, TaskCandidates, TaskRewardOracle, close_tasks, score_tasks
from learners.preference.comparators import (
    Comparator,
    api_policy,
    check_devices,
    frozen_copies,
    load_model_policies,
)
from learners.preference.records import PreferencePair
from learners.preference.replay import ReplayBuffer
from learners.preference.trainer_base import COLLECT, COMPARATOR, REPLAY, SELECT

POLICY_CKPT = "iteration_{:04d}"


class IterativeRounds:
    """Round bookkeeping, comparators and collection for the iterative trainers."""

    if TYPE_CHECKING:  # what the trainer this is mixed into provides (PreferenceTrainerBase and a subclass)
        config: Any  # the trainer's config, IterativeOptions mixed in
        policies: list[Policy]
        agent_names: list[str]
        run_dir: pathlib.Path
        task_oracle: TaskRewardOracle
        oracle: Oracle  # the trainer's oracle= hook, else task_oracle
        pairs: list[PreferencePair] | None  # the round's training pairs; None between rounds
        finished: bool

        def task_batches(self) -> list[list[int]]: ...

        def sample_tasks(
            self,
            tasks: Sequence[int],
            policies: Sequence[Policy],
            num_candidates: int,
            seed_key: Sequence[int],
            oracle: Oracle,
        ) -> list[TaskCandidates]: ...

        def generation_config(self, temperature: float | None = None) -> GenerationConfig: ...

        def _log(self, metrics: dict[str, float]) -> None: ...

        def _finish(self) -> None: ...

    def _init_rounds(self) -> None:
        c = self.config
        check_devices(c.comparator_devices, len(self.policies))
        if c.comparator_centralized_agent_index >= len(self.policies):
            raise ValueError(
                f"comparator_centralized_agent_index={c.comparator_centralized_agent_index} but the "
                f"team has {len(self.policies)} agents"
            )
        self.replay = ReplayBuffer(
            c.preference_replay_dir or self.run_dir / "preference_replay",
            c.preference_replay_mode,
            c.preference_replay_k,
            c.preference_replay_lambda,
            c.preference_replay_sample_size,
        )
        self.policy_checkpoint_root = pathlib.Path(c.policy_checkpoint_dir or self.run_dir / "policy_checkpoints")
        self.iteration = 0  # rounds completed
        self.comparator_dropped = 0
        self._fixed_comparator: Comparator | None = None  # model / api: built once per run
        self._history_copies: list | None = None  # history: one frozen copy, reloaded once per round
        self.comparator_loads = 0  # how many times comparator weights were (re)loaded

    # -- the round loop -----------------------------------------------------------------
    def run_rounds(self, stop_after: int | None = None, stop_after_rounds: int | None = None) -> dict[str, float]:
        """Run the remaining rounds; returns the last training metrics.

        ``stop_after`` is handed to :meth:`train_round` (MADPO: pause after that many updates
        in total, inside a round); ``stop_after_rounds`` pauses once that many rounds are
        complete. A paused run can be checkpointed and resumed; only a run that completed
        every round calls ``_finish`` (evaluation, final checkpoint, plot).
        """
        c = self.config
        if self.iteration == 0 and self.pairs is None:
            self.save_policy_checkpoint(0)
        last: dict[str, float] = {}
        while self.iteration < c.num_iterations:
            if stop_after_rounds is not None and self.iteration >= stop_after_rounds:
                return last
            round_ = self.iteration + 1
            if self.pairs is None:  # a new round (else: resuming one paused mid-training)
                comparator = self.build_comparator(round_)
                found, stats = self.collect_round(round_, comparator)
                self._log(stats)
                self.pairs = self.store_and_select(round_, found)
                self.begin_round(round_)
            if self.pairs:
                last = self.train_round(round_, self.pairs, stop_after) or last
                if not self.round_complete():
                    return last  # paused mid-round
            self.save_policy_checkpoint(round_)
            self.iteration, self.pairs = round_, None
        if not self.finished:
            self._finish()
        return last

    def begin_round(self, round_: int) -> None:
        """Reset the per-round training cursor (nothing by default)."""
        return None

    def train_round(self, round_: int, pairs: Sequence[PreferencePair], stop_after: int | None) -> dict[str, float]:
        """Train on the round's selected pairs; returns the last metrics."""
        raise NotImplementedError(f"{type(self).__name__} must say how a round trains on its pairs")

    def round_complete(self) -> bool:
        """Whether the current round's training finished (False: paused inside it)."""
        return True

    # -- comparators ------------------------------------------------------------------
    def _centralized_index(self) -> int | None:
        c = self.config
        return c.comparator_centralized_agent_index if c.comparator_generation_mode == "centralized" else None

    def build_comparator(self, round_: int) -> Comparator:
        """The comparator of round ``round_`` (1-based); weights are loaded here, once per round."""
        c, kind = self.config, self.config.comparator_policy
        central = self._centralized_index()
        if kind == "current":
            return Comparator(self.policies, self.agent_names, centralized_index=central, kind=kind)
        if kind == "current_copy":
            self.comparator_loads += 1
            return Comparator(
                frozen_copies(self.policies, c.comparator_devices),
                self.agent_names,
                centralized_index=central,
                kind=kind,
            )
        if kind == "history":
            if self._history_copies is None:
                self._history_copies = frozen_copies(self.policies, c.comparator_devices)
            path = self.history_checkpoint(round_)
            load_checkpoint(
                path, policies={f"agent_{i}": p for i, p in enumerate(self._history_copies)}, restore_rng=False
            )
            for p in self._history_copies:
                for param in p.parameters():
                    param.requires_grad_(False)
            self.comparator_loads += 1
            return Comparator(self._history_copies, self.agent_names, centralized_index=central, kind=kind)
        if self._fixed_comparator is None:
            if kind == "model":
                sources = list(c.comparator_agents or [c.comparator_model_name] * len(self.policies))
                if len(sources) != len(self.policies):
                    raise ValueError(f"comparator_agents names {len(sources)} models for {len(self.policies)} agents")
                policies = load_model_policies(sources, c.comparator_devices)
            else:  # api
                policies = [api_policy(c, c.max_new_tokens)] * len(self.policies)
            self.comparator_loads += 1
            self._fixed_comparator = Comparator(policies, self.agent_names, centralized_index=central, kind=kind)
        return self._fixed_comparator

    def history_checkpoint(self, round_: int) -> pathlib.Path:
        """The checkpoint ``comparator_history_k`` rounds before ``round_`` (or the initial one)."""
        back = max(0, round_ - self.config.resolved_history_k)
        while back > 0 and not self._policy_ckpt(back).exists():
            back -= 1
        return self._policy_ckpt(back)

    def _policy_ckpt(self, round_: int) -> pathlib.Path:
        return self.policy_checkpoint_root / POLICY_CKPT.format(round_)

    def save_policy_checkpoint(self, round_: int) -> pathlib.Path | None:
        """After round ``round_`` (0: the initial policies); only the history comparator needs them."""
        if self.config.comparator_policy != "history":
            return None
        return save_checkpoint(
            self._policy_ckpt(round_), policies={f"agent_{i}": p for i, p in enumerate(self.policies)}
        )

    # -- collection -------------------------------------------------------------------
    def preference_oracle(self) -> Oracle:
        return self.oracle

    def collect_round(self, round_: int, comparator: Comparator) -> tuple[list[PreferencePair], dict[str, float]]:
        c = self.config
        oracle = self.preference_oracle()
        n_target = c.preference_num_candidates
        n_comp = c.comparator_num_candidates or n_target
        pairs: list[PreferencePair] = []
        t0, dropped, partial, target_r, comp_r, wins = time.perf_counter(), 0, 0, [], [], 0
        for b, tasks in enumerate(self.task_batches()):
            target = self.sample_tasks(tasks, self.policies, n_target, (COLLECT, round_, b), oracle)
            others = [TaskCandidates(task=t.task, env=t.env, prompts=list(t.prompts)) for t in target]
            dropped += comparator.sample(
                others,
                n_comp,
                self.generation_config(),
                [derive_seed(c.seed, COMPARATOR, round_, b, i) for i in range(len(self.policies))],
            )
            partial += comparator.last_partial
            score_tasks(oracle, others)
            for t, o in zip(target, others, strict=True):
                found = pairs_against(
                    t,
                    o,
                    c.pair_selection,
                    c.preference_pairs_per_sample,
                    random.Random(derive_seed(c.seed, SELECT, round_, t.task)),
                    self.policies,
                )
                pairs.extend(found)
                wins += sum(_target_won(p, t) for p in found)
                target_r.extend(t.scored_rewards())
                comp_r.extend(o.scored_rewards())
            close_tasks(target)
        self.comparator_dropped += dropped
        stats = {
            "iter/current_iteration": float(round_),
            "iter/current_preference_pairs": float(len(pairs)),
            "iter/target_win_rate": wins / len(pairs) if pairs else 0.0,
            "iter/target_reward_mean": _mean(target_r),
            "iter/comparator_reward_mean": _mean(comp_r),
            "iter/comparator_dropped": float(dropped),
            "iter/comparator_partial": float(partial),  # kept, with a role's section missing (read as "")
            "iter/comparator_loads": float(self.comparator_loads),  # weight (re)loads so far
            "time/collect_s": time.perf_counter() - t0,
        }
        return pairs, stats

    def store_and_select(self, round_: int, pairs: list[PreferencePair]) -> list[PreferencePair]:
        self.replay.add_round(round_, pairs)
        selected = self.replay.select(random.Random(derive_seed(self.config.seed, REPLAY, round_)))
        self._log(
            {
                "iter/total_preference_pairs": float(sum(r.num_pairs for r in self.replay.rounds)),
                "iter/train_preference_pairs": float(len(selected)),
            }
        )
        return selected

    # -- checkpoint pieces --------------------------------------------------------------
    def _rounds_cursor(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "comparator_dropped": self.comparator_dropped,
            "replay": self.replay.state_dict(),
        }

    def _rounds_files(self) -> dict[str, bytes]:
        return {f"replay/{name}": data for name, data in self.replay.files().items()}

    def _restore_rounds(self, cursor: dict[str, Any], path: pathlib.Path) -> None:
        self.iteration = int(cursor["iteration"])
        self.comparator_dropped = int(cursor["comparator_dropped"])
        state = cursor["replay"]
        files = {
            f"iteration_{int(i):04d}.json": read_extra_file(path, f"replay/iteration_{int(i):04d}.json")
            for i, _ in state["rounds"]
        }
        self.replay.load_state_dict(state, files)


def _target_won(pair: PreferencePair, task: TaskCandidates) -> bool:
    """Whether the target side won (its raw reward is the winner's and the texts are its own)."""
    return (
        pair.raw_rewards is not None
        and pair.raw_rewards[0] == pair.target_raw_reward
        and pair.winner_completions in [c.completions for c in task.candidates if c is not None]
    )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
