"""Deterministic seeds derived from a base seed and a path of keys.

Every random draw of a training run (generation at a tree level, buffer shuffles, task
order) takes its seed from ``derive_seed(config.seed, step, ...)``, so a run resumed from a
checkpoint draws exactly what an uninterrupted run would, without saving RNG states.
"""

from __future__ import annotations

import numpy as np


def derive_seed(base: int, *keys: int) -> int:
    """A seed in ``[0, 2**31)`` that depends on ``base`` and every key, order included."""
    entropy = [int(base) & 0xFFFFFFFF] + [int(k) & 0xFFFFFFFF for k in keys]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] & 0x7FFFFFFF)
