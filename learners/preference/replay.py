"""The preference replay buffer of the iterative trainers (``preference_replay_mode``).

Every round's pairs are stored as ``preference_replay_dir/iteration_0001.json`` ...
(:mod:`learners.preference.records`); the buffer keeps an index of the rounds written by
THIS run (a folder left by an old run is overwritten round by round, never imported).
Which pairs a round trains on:

* ``current``     -- the pairs collected this round, as they are.
* ``nearest_k``   -- the latest ``preference_replay_k`` non-empty rounds (this one included).
* ``all_history`` -- every non-empty round.
* ``lambda_decay``-- every non-empty round, weighted by ``lambda ** age`` (age 0: the newest
  non-empty round; ``0 ** 0 = 1``, so lambda=0 keeps only the newest, lambda=1 weighs all
  rounds equally).

Historical modes weigh rounds, not pairs: a round of 3 pairs and one of 300 get the same
share at equal weight. ``preference_replay_sample_size`` draws (default: this round's pair
count, or the latest non-empty round's when this one is empty) are apportioned to the
rounds by weight with the largest-remainder rule (each round gets its exact share rounded
up or down; CoMLRL draws the round of every sample at random instead). Within a round,
pairs are drawn without replacement while they last, then from further shuffled copies.
The combined sample is shuffled.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import random
from dataclasses import dataclass
from typing import Any, Sequence

from learners.preference.records import PreferencePair, read_round, round_path, write_json_atomic, write_round

REPLAY_MODES = ("current", "nearest_k", "all_history", "lambda_decay")


def check_replay_options(mode: str, k: int | None, lam: float | None, sample_size: int | None) -> None:
    """Raise ValueError naming the option when the combination is not allowed."""
    if mode not in REPLAY_MODES:
        raise ValueError(f"preference_replay_mode must be one of {', '.join(REPLAY_MODES)}; got {mode!r}")
    if mode == "current":
        if k not in (None, 1):
            raise ValueError("preference_replay_k must be None or 1 with preference_replay_mode='current'")
        if lam is not None:
            raise ValueError(
                "preference_replay_lambda is only used by preference_replay_mode='lambda_decay'; remove it"
            )
        if sample_size is not None:
            raise ValueError(
                "preference_replay_sample_size needs a historical preference_replay_mode "
                "(nearest_k, all_history, lambda_decay); remove it with 'current'"
            )
        return
    if mode == "nearest_k":
        if k is None or k < 1:
            raise ValueError(f"preference_replay_mode='nearest_k' needs preference_replay_k >= 1, got {k}")
    elif k is not None:
        raise ValueError(f"preference_replay_k is only used by preference_replay_mode='nearest_k' (mode is {mode!r})")
    if mode == "lambda_decay":
        if lam is None or not (0.0 <= lam <= 1.0) or math.isnan(lam):
            raise ValueError(
                f"preference_replay_mode='lambda_decay' needs preference_replay_lambda in [0, 1], got {lam}"
            )
    elif lam is not None:
        raise ValueError(
            f"preference_replay_lambda is only used by preference_replay_mode='lambda_decay' (mode is {mode!r})"
        )
    if sample_size is not None and sample_size < 1:
        raise ValueError(f"preference_replay_sample_size must be >= 1 or None, got {sample_size}")


def lambda_weights(num_rounds: int, lam: float) -> list[float]:
    """Normalised weights, oldest round first; the newest (age 0) weighs ``lam ** 0 = 1``."""
    if num_rounds < 1:
        return []
    raw = [1.0 if age == 0 else lam**age for age in range(num_rounds)]  # newest first
    total = sum(raw)
    return [w / total for w in reversed(raw)]


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Split ``total`` draws by ``weights`` (largest remainder; ties favour later entries)."""
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    wsum = float(sum(weights))
    if total == 0 or wsum <= 0:
        return [0] * len(weights)
    exact = [total * w / wsum for w in weights]
    counts = [math.floor(x) for x in exact]
    left = total - sum(counts)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - counts[i]), -i))
    for i in order[:left]:
        counts[i] += 1
    return counts


def draw_from_round(pairs: Sequence[Any], count: int, rng: random.Random) -> list[Any]:
    """``count`` items: without replacement while they last, then more shuffled copies."""
    if count <= 0 or not pairs:
        return []
    out: list[Any] = []
    while len(out) < count:
        copy = list(pairs)
        rng.shuffle(copy)
        out.extend(copy[: count - len(out)])
    return out


@dataclass
class RoundInfo:
    iteration: int
    num_pairs: int

    @property
    def file_name(self) -> str:
        return round_path(".", self.iteration).name


class ReplayBuffer:
    """Round files plus the rule that turns them into each round's training pairs."""

    def __init__(
        self,
        directory: str | os.PathLike,
        mode: str = "current",
        k: int | None = None,
        lam: float | None = None,
        sample_size: int | None = None,
    ) -> None:
        check_replay_options(mode, k, lam, sample_size)
        self.directory = pathlib.Path(directory)
        self.mode, self.k, self.lam, self.sample_size = mode, k, lam, sample_size
        self.rounds: list[RoundInfo] = []
        self._cache: dict[int, list[PreferencePair]] = {}

    # -- writing ----------------------------------------------------------------------
    def add_round(self, iteration: int, pairs: Sequence[PreferencePair]) -> pathlib.Path:
        """Store round ``iteration`` (1-based, increasing) atomically and index it."""
        if self.rounds and iteration <= self.rounds[-1].iteration:
            raise ValueError(f"round {iteration} comes after round {self.rounds[-1].iteration}")
        path = write_round(self.directory, iteration, pairs)
        self.rounds.append(RoundInfo(iteration, len(pairs)))
        self._cache[iteration] = list(pairs)
        return path

    def pairs_of(self, iteration: int) -> list[PreferencePair]:
        if iteration not in self._cache:
            self._cache[iteration] = read_round(round_path(self.directory, iteration))
        return self._cache[iteration]

    # -- selection --------------------------------------------------------------------
    def eligible_rounds(self) -> list[RoundInfo]:
        """The non-empty rounds the mode draws from, oldest first."""
        nonempty = [r for r in self.rounds if r.num_pairs > 0]
        if self.mode == "nearest_k" and self.k is not None:  # check_replay_options: this mode has a k
            return nonempty[-self.k :]
        if self.mode == "current":
            return nonempty[-1:] if self.rounds and self.rounds[-1].num_pairs else []
        return nonempty

    def round_weights(self, rounds: Sequence[RoundInfo]) -> list[float]:
        if self.mode == "lambda_decay" and self.lam is not None:  # check_replay_options: this mode has a lam
            return lambda_weights(len(rounds), float(self.lam))
        return [1.0 / len(rounds)] * len(rounds) if rounds else []

    def default_sample_size(self) -> int:
        if self.sample_size is not None:
            return self.sample_size
        for r in reversed(self.rounds):  # the current round first, then the latest non-empty
            if r.num_pairs > 0:
                return r.num_pairs
        return 0

    def select(self, rng: random.Random) -> list[PreferencePair]:
        """The training pairs after the latest ``add_round``."""
        if not self.rounds:
            return []
        if self.mode == "current":
            return list(self.pairs_of(self.rounds[-1].iteration))
        rounds = self.eligible_rounds()
        if not rounds:
            return []
        counts = apportion(self.default_sample_size(), self.round_weights(rounds))
        sample: list[PreferencePair] = []
        for info, count in zip(rounds, counts, strict=True):
            sample.extend(draw_from_round(self.pairs_of(info.iteration), count, rng))
        rng.shuffle(sample)
        return sample

    # -- checkpoints ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"rounds": [[r.iteration, r.num_pairs] for r in self.rounds]}

    def files(self) -> dict[str, bytes]:
        """Every indexed round file's bytes, for a checkpoint."""
        return {r.file_name: round_path(self.directory, r.iteration).read_bytes() for r in self.rounds}

    def load_state_dict(self, state: dict[str, Any], files: dict[str, bytes]) -> None:
        """Restore the index and rewrite its files (the folder may have changed since)."""
        rounds = [RoundInfo(int(i), int(n)) for i, n in state["rounds"]]
        for r in rounds:
            if r.file_name not in files:
                raise ValueError(f"the checkpoint lacks the replay file {r.file_name}")
            write_json_atomic(round_path(self.directory, r.iteration), json.loads(files[r.file_name]))
        self.rounds = rounds
        self._cache = {}
