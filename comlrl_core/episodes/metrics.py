"""The metric vocabulary of every evaluation (trainers' ``eval/...``, ``comlrl eval``,
the main job's table). See ``docs/evaluation.md``.

* ``turn_{t}/reward_mean`` -- mean team reward at turn ``t`` over the episodes that
  reached it (early termination ends an episode); ``turn_{t}/num_episodes`` counts them.
* ``return_mean`` -- mean discounted return from turn 1, ``sum_t discount**(t-1) r_t``.
* ``pass@k`` -- the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` of Chen et al. (2021),
  averaged over tasks, where ``c`` of a task's ``n`` episodes passed
  (:func:`comlrl_core.env_api.step_passed` on the last step). Reported for every asked
  ``k <= episodes_per_task``, and only when the env gives a verdict for every episode.
* ``test_pass_rate`` -- mean over episodes of the final step's ``pass_rate`` info (the
  fraction of the task's asserts passed); ``turn_{t}/test_pass_rate`` the same at turn ``t``
  (over the episodes that reached it). Only when every episode's steps report it.
* ``syntax_valid_rate`` -- share of episodes whose final step's ``levels["syntax"]`` info is 1
  (every completion and the joined program parse).
* ``cooperation_rate`` -- share of episodes whose final main calls a helper the aux agent
  defined (infos ``found["aux"]`` and ``cooperation["calls_aux"]``, as CoopCode reports them).
* ``num_tasks``, ``episodes_per_task``, ``num_episodes`` -- what was evaluated.

:func:`episode_rows` gives the same values per episode (keyed by task and sample), which is
what a paired before / after comparison needs (:mod:`comlrl_core.episodes.intervals`).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import numpy as np

from comlrl_core.episodes.engine import EpisodeRecord

__all__ = ["COUNT_METRICS", "EPISODE_VALUES", "episode_metrics", "episode_rows", "episode_values", "pass_at_k"]

#: metric names (or suffixes) that hold counts, not rates
COUNT_METRICS = ("num_tasks", "episodes_per_task", "num_episodes")
#: info numbers read (``EpisodeRecord.step_infos`` keys): the fraction of asserts passed, the
#: syntax level, and the two flags of "main calls a helper that aux defined"
PASS_RATE_INFO = "pass_rate"
SYNTAX_INFO = "levels/syntax"
COOPERATION_INFOS = ("found/aux", "cooperation/calls_aux")
#: per-episode values and the metric each one's mean is reported as
EPISODE_VALUES = {
    "return": "return_mean",
    "test_pass_rate": "test_pass_rate",
    "syntax_valid": "syntax_valid_rate",
    "cooperation": "cooperation_rate",
}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for ``c`` passing samples out of ``n``.

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``, which equals
    ``1 - C(n-c, k) / C(n, k)`` without huge binomials.
    """
    if not (0 <= c <= n) or k < 1 or k > n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def episode_values(ep: EpisodeRecord, discount: float = 1.0) -> dict[str, float]:
    """One episode's values: ``return``, and where its infos report them ``test_pass_rate``
    (final step), ``turn_{t}/test_pass_rate``, ``syntax_valid``, ``cooperation`` (0 / 1)."""
    out = {"return": ep.discounted_return(discount)}
    steps = ep.step_infos
    if steps and all(PASS_RATE_INFO in step for step in steps):
        for t, step in enumerate(steps, start=1):
            out[f"turn_{t}/test_pass_rate"] = step[PASS_RATE_INFO]
        out["test_pass_rate"] = steps[-1][PASS_RATE_INFO]
    if steps and SYNTAX_INFO in steps[-1]:
        out["syntax_valid"] = float(steps[-1][SYNTAX_INFO] >= 1.0)
    if steps and all(key in steps[-1] for key in COOPERATION_INFOS):
        out["cooperation"] = float(all(steps[-1][key] > 0 for key in COOPERATION_INFOS))
    return out


def episode_rows(episodes: Sequence[EpisodeRecord], discount: float = 1.0) -> list[dict[str, Any]]:
    """One plain dict per episode: ``task``, ``sample``, ``passed`` (True / False / None), the turn
    ``rewards`` and :func:`episode_values` (JSON-ready; the before / after pairing key is
    ``(task, sample)``)."""
    rows: list[dict[str, Any]] = []
    for ep in episodes:
        row: dict[str, Any] = {"task": ep.task, "sample": ep.sample}
        row["passed"] = None if ep.passed is None else bool(ep.passed)
        row["rewards"] = [float(r) for r in ep.rewards]
        row.update(episode_values(ep, discount))
        rows.append(row)
    return rows


def episode_metrics(
    episodes: Sequence[EpisodeRecord], *, discount: float = 1.0, k: Iterable[int] = (1,), prefix: str = ""
) -> dict[str, float]:
    """The evaluation metrics of ``episodes`` (see the module docstring); keys get ``prefix``."""
    if not episodes:
        return {}
    out: dict[str, float] = {}
    by_task: dict[int, list[EpisodeRecord]] = {}
    for ep in episodes:
        by_task.setdefault(ep.task, []).append(ep)
    per_task = {len(v) for v in by_task.values()}
    if len(per_task) != 1:
        raise ValueError(f"every task needs the same number of episodes, got {sorted(per_task)}")
    n = per_task.pop()
    verdicts = [ep.passed for ep in episodes]
    if all(v is not None for v in verdicts):
        for kk in sorted({int(x) for x in k}):
            if 1 <= kk <= n:
                out[f"pass@{kk}"] = _mean(
                    [pass_at_k(n, sum(bool(e.passed) for e in eps), kk) for eps in by_task.values()]
                )
    longest = max(len(ep.rewards) for ep in episodes)
    for t in range(longest):
        reached = [ep.rewards[t] for ep in episodes if len(ep.rewards) > t]
        out[f"turn_{t + 1}/reward_mean"] = _mean(reached)
        out[f"turn_{t + 1}/num_episodes"] = float(len(reached))
    out["return_mean"] = _mean([ep.discounted_return(discount) for ep in episodes])
    values = [episode_values(ep, discount) for ep in episodes]
    for t in range(longest):
        key = f"turn_{t + 1}/test_pass_rate"
        reached = [v[key] for v in values if key in v]
        if reached and all("test_pass_rate" in v for v in values):
            out[key] = _mean(reached)
    for value, metric in EPISODE_VALUES.items():
        if value != "return" and all(value in v for v in values):
            out[metric] = _mean([v[value] for v in values])
    out["num_tasks"] = float(len(by_task))
    out["episodes_per_task"] = float(n)
    out["num_episodes"] = float(len(episodes))
    return {f"{prefix}{key}": value for key, value in out.items()}
