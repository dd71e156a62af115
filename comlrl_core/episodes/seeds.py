"""The seeding rule of evaluation episodes.

An episode's randomness depends only on ``(seed, task index, sample index)`` (its env
reset) and ``(seed, task index, sample index, turn, agent index)`` (each generation), so
evaluating a subset or a superset of the tasks, or in other batches, gives every episode
the same draws. Seeds come from :func:`derive_seed`, the same derivation as the
learners' ``learners.common.seeding.derive_seed``.
"""

from __future__ import annotations

from comlrl_core.run.seeds import derive_seed

__all__ = ["derive_seed", "episode_seed", "generation_seed"]

# Seed-path tags keep the two streams of an episode apart.
_RESET, _GENERATE = 1, 2


def episode_seed(seed: int, task: int, sample: int) -> int:
    """The ``env.reset`` seed of sample ``sample`` of task ``task``."""
    return derive_seed(seed, _RESET, task, sample)


def generation_seed(seed: int, task: int, sample: int, turn: int, agent: int) -> int:
    """The seed of agent ``agent``'s completion at turn ``turn`` (1-based) of that episode."""
    return derive_seed(seed, _GENERATE, task, sample, turn, agent)
