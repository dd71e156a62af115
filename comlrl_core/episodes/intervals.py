"""Paired bootstrap intervals of a before / after difference (the main job's table).

An evaluation plays ``n`` episodes (samples) of each of the same problems before and after
training, with the same per-episode seeds (:mod:`comlrl_core.episodes.seeds`), so episode
``(problem, sample)`` before pairs with episode ``(problem, sample)`` after. The problems
are the independent units: :func:`paired_bootstrap` resamples PROBLEMS with replacement (each
with all its samples) and recomputes the mean per-problem difference, ``resamples`` times,
with a fixed seed. The interval is the percentile interval of those means.

A metric enters as one value per problem and side (a per-episode metric is first averaged
over the problem's samples; pass@k is a per-problem value already), so that every metric of
the table uses the same resampling.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from comlrl_core.episodes.metrics import EPISODE_VALUES, pass_at_k

__all__ = ["DEFAULT_RESAMPLES", "DiffInterval", "compare_episode_rows", "paired_bootstrap", "per_problem_means"]

#: one value per problem: a list, a tuple or a 1-d array
Values = Sequence[float] | np.ndarray

#: resamples of the main job's intervals (enough for stable 2.5 % / 97.5 % percentiles)
DEFAULT_RESAMPLES = 4000


@dataclass(frozen=True)
class DiffInterval:
    """``after - before`` with its bootstrap interval ``[low, high]`` at ``level``."""

    before: float
    after: float
    difference: float
    low: float
    high: float
    level: float
    num_problems: int
    resamples: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_values(name: str, values: Values) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one value per problem, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} holds a value that is not a finite number: {list(values)}")
    return array


def paired_bootstrap(
    before: Values,
    after: Values,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> DiffInterval:
    """Mean of ``after[i] - before[i]`` over problems ``i`` and its paired bootstrap interval.

    ``before[i]`` and ``after[i]`` are problem ``i``'s values before and after. Identical
    sides give ``[0, 0]``; adding a constant to every ``after`` value shifts the interval by
    that constant (the resampled problems depend on ``seed`` only).
    """
    b = _check_values("before", before)
    a = _check_values("after", after)
    if len(b) != len(a):
        raise ValueError(f"before has {len(b)} problems but after has {len(a)}; they must be the same problems")
    if len(b) == 0:
        raise ValueError("paired_bootstrap needs at least one problem")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be an int >= 1, got {resamples!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    diffs = a - b
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(diffs), size=(resamples, len(diffs)))
    means = diffs[picks].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    point = float(diffs.mean())
    # the percentiles of resampled means can miss the mean itself by float rounding (or, for a
    # few very skewed problems, by a resample grid step): the interval is widened to hold it
    return DiffInterval(
        before=float(b.mean()),
        after=float(a.mean()),
        difference=point,
        low=min(float(low), point),
        high=max(float(high), point),
        level=level,
        num_problems=len(diffs),
        resamples=resamples,
    )


def _order(key: Hashable) -> tuple[int, Any]:
    """Problems in their natural order: task indices as numbers, other ids by their text."""
    return (0, key) if isinstance(key, int) else (1, repr(key))


def per_problem_means(
    before: Mapping[tuple[Any, int], float], after: Mapping[tuple[Any, int], float]
) -> tuple[list[float], list[float]]:
    """Per-episode values keyed by ``(problem, sample)`` -> one mean per problem and side.

    Both sides must hold the same episodes (that is what makes the difference paired);
    problems come out in sorted order.
    """
    if set(before) != set(after):
        missing = sorted(set(before) ^ set(after), key=repr)[:5]
        raise ValueError(f"before and after must hold the same (problem, sample) episodes; unpaired: {missing}")
    problems: dict[Hashable, list[tuple[float, float]]] = {}
    for key in sorted(before, key=lambda pair: (_order(pair[0]), pair[1])):
        problems.setdefault(key[0], []).append((float(before[key]), float(after[key])))
    b = [math.fsum(x for x, _ in pairs) / len(pairs) for pairs in problems.values()]
    a = [math.fsum(y for _, y in pairs) / len(pairs) for pairs in problems.values()]
    return b, a


def _keyed(rows: Sequence[Mapping[str, Any]], value: str) -> dict[tuple[Any, int], float] | None:
    """``(task, sample) -> row[value]``, or None when some row lacks the value."""
    if not all(value in row and row[value] is not None for row in rows):
        return None
    return {(row["task"], int(row["sample"])): float(row[value]) for row in rows}


def _per_problem_pass_at_k(rows: Sequence[Mapping[str, Any]], k: int) -> dict[Hashable, float] | None:
    by_task: dict[Hashable, list[int]] = {}
    for row in rows:
        if row.get("passed") is None:
            return None
        by_task.setdefault(row["task"], []).append(int(row["passed"]))
    n = {len(v) for v in by_task.values()}
    if len(n) != 1 or k > next(iter(n)):
        return None
    return {task: pass_at_k(len(v), sum(v), k) for task, v in by_task.items()}


def compare_episode_rows(
    before: Sequence[Mapping[str, Any]],
    after: Sequence[Mapping[str, Any]],
    *,
    k: Sequence[int] = (1,),
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, DiffInterval]:
    """Before / after / difference / interval of every metric both sides' episode rows
    (:func:`comlrl_core.episodes.metrics.episode_rows`) hold, paired by ``(task, sample)``.

    Keys: ``return_mean`` (team reward), ``test_pass_rate`` and ``turn_{t}/test_pass_rate``,
    ``syntax_valid_rate``, ``cooperation_rate`` and ``pass@k`` for each ``k`` up to the
    samples per problem. Every metric resamples the same problems (same ``seed``).
    """
    if not before or not after:
        raise ValueError("compare_episode_rows needs episode rows on both sides")
    values = [v for v in EPISODE_VALUES if v != "test_pass_rate"]
    turns = sorted(
        {key for row in before for key in row if key.startswith("turn_") and key.endswith("/test_pass_rate")}
    )
    names = {v: EPISODE_VALUES[v] for v in values} | {"test_pass_rate": "test_pass_rate"} | {t: t for t in turns}
    out: dict[str, DiffInterval] = {}
    for value, metric in names.items():
        b, a = _keyed(before, value), _keyed(after, value)
        if b is None or a is None:
            continue
        out[metric] = paired_bootstrap(*per_problem_means(b, a), resamples=resamples, seed=seed, level=level)
    for kk in sorted({int(x) for x in k}):
        pb, pa = _per_problem_pass_at_k(before, kk), _per_problem_pass_at_k(after, kk)
        if pb is None or pa is None:
            continue
        if set(pb) != set(pa):
            raise ValueError("before and after must evaluate the same problems")
        tasks = sorted(pb, key=_order)
        out[f"pass@{kk}"] = paired_bootstrap(
            [pb[t] for t in tasks], [pa[t] for t in tasks], resamples=resamples, seed=seed, level=level
        )
    order = ["return_mean", "test_pass_rate", *turns, *(k for k in out if k.startswith("pass@"))]
    return {key: out[key] for key in [*order, *sorted(out)] if key in out} | out
