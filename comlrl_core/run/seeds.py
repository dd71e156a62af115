"""Seeds: one derivation rule for every random draw, and seeded weight initialisation.

:func:`derive_seed` turns a base seed and a path of integer keys into a seed; episodes
(:mod:`comlrl_core.episodes.seeds`), learners (``learners.common.seeding``) and team
building all draw from it, so a run's randomness depends on its seed and not on the order
or process things run in. :func:`torch_seeded` runs a block on torch's global random state
seeded from such a seed and puts the state back after it: weights that are drawn, not
loaded (a new LoRA adapter, a value head), come out the same in every process. torch
itself seeds a fresh process from the OS, so without it they differ in every run.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np

__all__ = ["derive_seed", "torch_seeded"]


def derive_seed(base: int, *keys: int) -> int:
    """A seed in ``[0, 2**31)`` that depends on ``base`` and every key, order included."""
    entropy = [int(base) & 0xFFFFFFFF] + [int(k) & 0xFFFFFFFF for k in keys]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] & 0x7FFFFFFF)


@contextlib.contextmanager
def torch_seeded(seed: int) -> Iterator[None]:
    """torch's global random state seeded with ``seed`` inside the block (CPU and every
    CUDA device) and put back as it was after it (CUDA's where CUDA is already running):
    what the block draws (a new adapter's or head's initial weights) depends on ``seed``
    alone, and the caller's own random stream is untouched. torch seeds a fresh process
    from the OS, so without this such weights differ in every run."""
    import torch

    # CUDA generators are saved and put back only where CUDA already runs: reading them would
    # start CUDA in a CPU-only process (torch.manual_seed seeds them lazily either way)
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
