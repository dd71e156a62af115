"""Keep freed memory in the process heap on CPU runs (glibc only).

A training step on CPU allocates and frees the same large tensors over and over:
gradients as big as the model, the embedding gradient (vocabulary x hidden), logits.
glibc serves every allocation above its mmap threshold (at most 32 MiB by default) with
fresh pages from the kernel and unmaps them on free, so each step page-faults its way
through hundreds of MB again: on SmolLM2-135M that is roughly a tenth of an update step
on 2 cores. Raising the mmap and trim thresholds makes freed blocks stay in the heap
for reuse (GPU frameworks get the same effect from their caching allocators).

The cost: memory freed at the end of a run stays mapped to the process until it exits,
so its resident size stays near its peak. The peak itself does not grow. Because it
changes the whole host process for good, it is opt-in: nothing here runs on import, and
trainers call :func:`retain_freed_memory` only under the ``retain_freed_memory`` option
(default off; the measurement is in docs/performance.md).
"""

from __future__ import annotations

import ctypes
import platform
import sys

# mallopt parameter numbers (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

_applied = False


def retain_freed_memory(
    mmap_threshold: int = 1 << 30, trim_threshold: int = (1 << 31) - 1, top_pad: int = 64 << 20
) -> bool:
    """Serve allocations below ``mmap_threshold`` bytes from the heap and keep up to
    ``trim_threshold`` bytes of freed memory there. Process-wide and idempotent; returns
    whether the allocator accepted it (False off Linux/glibc, where nothing changes)."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = all(
        mallopt(param, value) == 1
        for param, value in (
            (M_MMAP_THRESHOLD, mmap_threshold),
            (M_TRIM_THRESHOLD, trim_threshold),
            (M_TOP_PAD, top_pad),
        )
    )
    _applied = ok
    return ok
