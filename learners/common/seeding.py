"""Deterministic seeds derived from a base seed and a path of keys.

Every random draw of a training run (generation at a tree level, buffer shuffles, task
order) takes its seed from ``derive_seed(config.seed, step, ...)``, so a run resumed from a
checkpoint draws exactly what an uninterrupted run would, without saving RNG states.
The derivation is the episode engine's (``comlrl_core.episodes.seeds.derive_seed``).
"""

from __future__ import annotations

from comlrl_core.episodes.seeds import derive_seed

__all__ = ["derive_seed"]
