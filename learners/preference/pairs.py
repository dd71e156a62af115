"""Which candidate joint responses become preference pairs (pure functions).

Within one set of candidates (base trainers), every ordered pair ``(w, l)`` with
``reward[w] > reward[l]`` is eligible; ties never are. ``pair_selection``:

* ``reward_gap`` (default) -- the largest reward gaps first (ties of gap: lower indices first);
* ``random``   -- a seeded random order;
* ``all``      -- every eligible pair, ordered by (winner, loser) index;

then the first ``preference_pairs_per_sample`` are kept (``all`` keeps every one and
requires the limit to be None).

Against a comparator (iterative trainers), only candidates with the SAME index are
compared: target candidate ``i`` against comparator candidate ``i``, for the indices both
sides have; either side may win, ties are dropped. The same modes apply, plus
``comparator_reward``: the comparisons whose comparator candidate scored highest first
(then the larger gap) -- it prefers learning against the comparator's best answers.
A candidate index missing on either side (e.g. an unparseable centralized response) is
simply not compared.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Sequence, TypeGuard

BASE_PAIR_SELECTIONS = ("reward_gap", "random", "all")
PAIR_SELECTIONS = BASE_PAIR_SELECTIONS + ("comparator_reward",)


def _check(mode: str, limit: int | None, allowed: Sequence[str]) -> None:
    if mode not in allowed:
        raise ValueError(f"pair_selection must be one of {', '.join(allowed)}; got {mode!r}")
    if mode == "all" and limit is not None:
        raise ValueError("pair_selection='all' keeps every pair: set preference_pairs_per_sample=None")
    if limit is not None and limit < 1:
        raise ValueError(f"preference_pairs_per_sample must be >= 1 or None, got {limit}")


def _finite(x: float | None) -> TypeGuard[float]:
    return x is not None and math.isfinite(x)


def select_pairs(
    rewards: Sequence[float], mode: str = "reward_gap", limit: int | None = None, rng: random.Random | None = None
) -> list[tuple[int, int]]:
    """``(winner_index, loser_index)`` pairs among one task's candidates (see module doc).

    Non-finite rewards never enter a pair.
    """
    _check(mode, limit, BASE_PAIR_SELECTIONS)
    eligible = [
        (float(rewards[w]) - float(rewards[lose]), w, lose)
        for w in range(len(rewards))
        for lose in range(len(rewards))
        if _finite(rewards[w]) and _finite(rewards[lose]) and rewards[w] > rewards[lose]
    ]
    if mode == "random":
        (rng or random.Random(0)).shuffle(eligible)
    elif mode == "reward_gap":
        eligible.sort(key=lambda e: (-e[0], e[1], e[2]))
    # "all": already in (winner, loser) order
    if limit is not None:
        eligible = eligible[:limit]
    return [(w, lose) for _, w, lose in eligible]


@dataclass(frozen=True)
class Comparison:
    """Target candidate ``index`` against comparator candidate ``index``."""

    index: int
    target_wins: bool
    target_reward: float
    comparator_reward: float

    @property
    def gap(self) -> float:
        return abs(self.target_reward - self.comparator_reward)


def select_comparisons(
    target_rewards: Sequence[float | None],
    comparator_rewards: Sequence[float | None],
    mode: str = "comparator_reward",
    limit: int | None = None,
    rng: random.Random | None = None,
) -> list[Comparison]:
    """Same-index comparisons of target and comparator candidates (see module doc).

    A ``None`` (dropped candidate) or non-finite reward is never compared. The two sides
    may have different lengths: indices beyond the shorter one are not compared.
    """
    _check(mode, limit, PAIR_SELECTIONS)
    eligible = []
    for i in range(min(len(target_rewards), len(comparator_rewards))):
        t, c = target_rewards[i], comparator_rewards[i]
        if not (_finite(t) and _finite(c)) or t == c:
            continue
        eligible.append(Comparison(i, t > c, float(t), float(c)))
    if mode == "random":
        (rng or random.Random(0)).shuffle(eligible)
    elif mode == "reward_gap":
        eligible.sort(key=lambda e: (-e.gap, e.index))
    elif mode == "comparator_reward":
        eligible.sort(key=lambda e: (-e.comparator_reward, -e.gap, e.index))
    if limit is not None:
        eligible = eligible[:limit]
    return eligible
