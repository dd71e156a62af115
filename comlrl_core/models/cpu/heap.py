"""Keep freed memory in the process heap while a CPU training run is going (glibc only).

A training step on CPU allocates and frees the same large tensors over and over:
gradients as big as the model, the embedding gradient (vocabulary x hidden), logits,
attention scores. glibc serves every allocation above its mmap threshold (at most 32 MiB
by default) with fresh pages from the kernel and unmaps them on free, and trims the top
of its heap whenever more than twice that is free, so each step page-faults its way
through hundreds of MB again. On SmolLM2-135M full fine-tuning (2 cores) that is about
three tenths of an update (docs/performance.md). Raising the mmap and trim thresholds
makes freed blocks stay in the heap for reuse (GPU frameworks get the same effect from
their caching allocators).

The cost is that freed memory stays mapped, so the resident size sits near its peak. That
is why the setting is scoped: :func:`retained_heap` applies it for the duration of a block
(trainers wrap ``train()`` in it) and on leaving sets bounded thresholds and hands the
free memory back to the kernel (``malloc_trim``), so a notebook does not keep a run's
peak afterwards. :func:`retain_freed_memory` alone is the process-wide, one-way switch.
Nothing here runs on import. Under another allocator (tcmalloc preloaded, musl) glibc's
heap is not the one in use and these calls change nothing that matters.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from contextlib import contextmanager
from typing import Iterator

# mallopt parameter numbers (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3

# What the heap is left with after a retained block: glibc's own ceilings for its dynamic
# thresholds (64-bit), which a long-lived process reaches anyway after freeing one large
# block; mallopt cannot give the dynamic behaviour back once a threshold was set.
RELEASED_MMAP_THRESHOLD = 32 << 20
RELEASED_TRIM_THRESHOLD = 64 << 20
RELEASED_TOP_PAD = 128 << 10

_applied = False
_depth = 0  # nesting of retained_heap blocks that applied the setting


def retain_freed_memory(
    mmap_threshold: int = 1 << 30, trim_threshold: int = (1 << 31) - 1, top_pad: int = 64 << 20
) -> bool:
    """Serve allocations below ``mmap_threshold`` bytes from the heap and keep up to
    ``trim_threshold`` bytes of freed memory there. Process-wide and idempotent; returns
    whether the allocator accepted it (False off Linux/glibc, where nothing changes)."""
    global _applied
    if _applied:
        return True
    _applied = _set_thresholds(mmap_threshold, trim_threshold, top_pad)
    return _applied


def release_retained_memory() -> bool:
    """Undo :func:`retain_freed_memory`: bounded thresholds (glibc's dynamic ceilings) and
    the heap's free memory handed back to the kernel. Returns whether anything was held."""
    global _applied
    if not _applied:
        return False
    _set_thresholds(RELEASED_MMAP_THRESHOLD, RELEASED_TRIM_THRESHOLD, RELEASED_TOP_PAD)
    _applied = False
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        libc.malloc_trim(0)
    return True


@contextmanager
def retained_heap(enabled: bool = True) -> Iterator[bool]:
    """Freed memory stays in the heap inside the block (when ``enabled`` and on glibc);
    the outermost block that applied it releases it on the way out, also on an error.
    Yields whether the setting is in effect. A process that applied
    :func:`retain_freed_memory` itself keeps it: the block then leaves it alone."""
    global _depth
    if not enabled:
        yield False
        return
    owner = _depth > 0 or not _applied  # someone else's process-wide setting is not ours to undo
    applied = retain_freed_memory()
    if not (applied and owner):
        yield applied
        return
    _depth += 1
    try:
        yield True
    finally:
        _depth -= 1
        if _depth == 0:
            release_retained_memory()


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _set_thresholds(mmap_threshold: int, trim_threshold: int, top_pad: int) -> bool:
    libc = _glibc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(
        mallopt(param, value) == 1
        for param, value in (
            (M_MMAP_THRESHOLD, mmap_threshold),
            (M_TRIM_THRESHOLD, trim_threshold),
            (M_TOP_PAD, top_pad),
        )
    )
