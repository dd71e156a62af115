"""What the process holds in host memory, and what its allocator keeps free for reuse.

A training run's resident size is the memory its tensors and objects use *plus* what the C
allocator keeps mapped after they were freed. The two call for different fixes (release
the allocator's free memory vs. stop keeping objects), so the trainers log both per step:

* ``memory/rss_gib``: the resident size now (``/proc/self/statm``);
* ``memory/peak_rss_gib``: the largest resident size so far (``ru_maxrss``);
* ``memory/allocator_free_gib``: freed memory the allocator still has mapped -- tcmalloc's
  page heap and caches (``MallocExtension_GetNumericProperty``), or glibc's free heap
  chunks (``mallinfo2``). Absent where neither can say.

:func:`release_free_memory` hands that free memory back to the kernel (tcmalloc's
``MallocExtension_ReleaseFreeMemory``, glibc's ``malloc_trim``). Everything is read on
demand; nothing runs on import.

Inside a :func:`released_between_phases` block (trainers wrap ``train()`` in it),
:func:`end_of_phase` releases that memory: the samplers call it after each sampling call
(its KV cache, the largest transient of a rollout, is gone by then) and the trainers after
each rollout, update and evaluation; at level ``"micro_batch"``, :func:`end_of_micro_batch`
also does after each scored micro-batch's backward. Freed memory then does not add to the
next phase's peak; the price is that the next phase page-faults its memory in again.
"""

from __future__ import annotations

import ctypes
import functools
import os
import resource
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from comlrl_core.models.cpu.allocator import loaded_allocator

GIB = float(1 << 30)

#: how often train() hands freed memory back: never, after each phase (sampling call,
#: rollout, update, evaluation), or also after each scored micro-batch
RELEASE_LEVELS = ("never", "phase", "micro_batch")
_levels: list[int] = []  # the levels of the open released_between_phases blocks

# tcmalloc (gperftools) properties that count freed memory it keeps mapped; page-heap
# memory it already unmapped is not resident and is left out
TCMALLOC_FREE_PROPERTIES = (
    "tcmalloc.pageheap_free_bytes",
    "tcmalloc.central_cache_free_bytes",
    "tcmalloc.transfer_cache_free_bytes",
    "tcmalloc.thread_cache_free_bytes",
)


class _Mallinfo2(ctypes.Structure):
    # glibc >= 2.33 (malloc.h): every field a size_t
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def resident_bytes() -> int:
    """The resident size of this process now (0 where ``/proc`` is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def peak_resident_bytes() -> int:
    """The largest resident size this process has had (``ru_maxrss``, which the kernel
    updates lazily, so never below the size now)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux
    return max(peak, resident_bytes())


@functools.cache
def _process_allocator() -> str:
    # a process's allocator is fixed when it starts; the releases run after every sampling
    # call and scored group, so /proc/self/maps is read once, not each time
    return loaded_allocator()


@functools.cache
def _c_function(name: str, argtypes: tuple[Any, ...], restype: Any) -> Any:
    """``name`` among the C functions this process has mapped (a preloaded allocator
    included), typed; None where it is missing. Looked up once per process."""
    try:
        function = getattr(ctypes.CDLL(None), name, None)
    except OSError:
        return None
    if function is not None:
        function.argtypes, function.restype = list(argtypes), restype
    return function


def allocator_free_bytes(allocator: str | None = None) -> int | None:
    """Freed memory the allocator still keeps mapped for reuse, or None where it cannot tell
    (jemalloc, musl, macOS)."""
    allocator = allocator or _process_allocator()
    if allocator == "tcmalloc":
        get = _c_function(
            "MallocExtension_GetNumericProperty", (ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)), ctypes.c_int
        )
        if get is None:
            return None
        total, value = 0, ctypes.c_size_t()
        for name in TCMALLOC_FREE_PROPERTIES:
            if get(name.encode(), ctypes.byref(value)):
                total += value.value
        return total
    mallinfo2 = _c_function("mallinfo2", (), _Mallinfo2) if allocator == "glibc" else None
    return None if mallinfo2 is None else int(mallinfo2().fordblks)


def release_free_memory(allocator: str | None = None) -> bool:
    """Hand the allocator's free memory back to the kernel; returns whether it could."""
    allocator = allocator or _process_allocator()
    if allocator == "tcmalloc":
        release = _c_function("MallocExtension_ReleaseFreeMemory", (), None)
        if release is not None:
            release()
            return True
    elif allocator == "glibc":
        trim = _c_function("malloc_trim", (ctypes.c_size_t,), ctypes.c_int)
        if trim is not None:
            trim(0)
            return True
    return False


def host_memory_metrics() -> dict[str, float]:
    """The per-step memory metrics (GiB) named in the module docstring."""
    metrics = {"memory/rss_gib": resident_bytes() / GIB, "memory/peak_rss_gib": peak_resident_bytes() / GIB}
    free = allocator_free_bytes()
    if free is not None:
        metrics["memory/allocator_free_gib"] = free / GIB
    return metrics


@contextmanager
def released_between_phases(level: str = "phase") -> Iterator[str]:
    """Inside the block, :func:`end_of_phase` (``level`` ``"phase"`` or ``"micro_batch"``)
    and :func:`end_of_micro_batch` (``"micro_batch"`` only) release the allocator's free
    memory; ``"never"`` changes nothing. Nested blocks: the innermost level holds. Yields
    ``level``."""
    if level not in RELEASE_LEVELS:
        raise ValueError(f"release level must be one of {RELEASE_LEVELS}, got {level!r}")
    _levels.append(RELEASE_LEVELS.index(level))
    try:
        yield level
    finally:
        _levels.pop()


def _release_at(level: int) -> bool:
    return bool(_levels) and _levels[-1] >= level and release_free_memory()


def end_of_phase() -> bool:
    """A sampling call, rollout, update or evaluation is over: hand the allocator's free
    memory back inside a ``"phase"`` or ``"micro_batch"`` block. Returns whether it did."""
    return _release_at(1)


def end_of_micro_batch() -> bool:
    """A scored micro-batch's backward is done: hand the allocator's free memory back
    inside a ``"micro_batch"`` block. Returns whether it did."""
    return _release_at(2)
