"""The metric vocabulary of every evaluation (trainers' ``eval/...``, ``comlrl eval``,
the main job's table). See ``docs/evaluation.md``.

* ``turn_{t}/reward_mean`` -- mean team reward at turn ``t`` over the episodes that
  reached it (early termination ends an episode); ``turn_{t}/num_episodes`` counts them.
* ``return_mean`` -- mean discounted return from turn 1, ``sum_t discount**(t-1) r_t``.
* ``pass@k`` -- the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` of Chen et al. (2021),
  averaged over tasks, where ``c`` of a task's ``n`` episodes passed
  (:func:`comlrl_core.env_api.step_passed` on the last step). Reported for every asked
  ``k <= episodes_per_task``, and only when the env gives a verdict for every episode.
* ``num_tasks``, ``episodes_per_task``, ``num_episodes`` -- what was evaluated.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from comlrl_core.episodes.engine import EpisodeRecord

__all__ = ["COUNT_METRICS", "episode_metrics", "pass_at_k"]

#: metric names (or suffixes) that hold counts, not rates
COUNT_METRICS = ("num_tasks", "episodes_per_task", "num_episodes")


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
    out["num_tasks"] = float(len(by_task))
    out["episodes_per_task"] = float(n)
    out["num_episodes"] = float(len(episodes))
    return {f"{prefix}{key}": value for key, value in out.items()}
