"""Which C allocator serves this process, and the environment that starts a process on another.

A LoRA update on CPU allocates a few hundred MB of activations per micro-batch and frees
them in the backward pass, every micro-batch. glibc's malloc raises its mmap threshold
each time it frees an mmapped block (up to 32 MiB), so from the second micro-batch on
those activations come from the heap, where the freed blocks of one pass do not fit the
next pass's requests and the heap keeps growing: the resident peak ends up about 1 MB a
token above what the pass actually holds. tcmalloc and jemalloc reuse freed blocks by size
class and do not drift. Measured on one LoRA forward + backward of a 662-token group of
SmolLM2-135M (`bench/memory_probe.py --allocators glibc tcmalloc jemalloc`, figures in
docs/performance.md "Allocator"): glibc peaks ~1 GiB above tcmalloc, and fixing glibc's
threshold instead (``MALLOC_MMAP_THRESHOLD_=131072``) removes the drift but makes the pass
~1.5x slower (every block is page-faulted in again).

An allocator is chosen when a process starts (``LD_PRELOAD``); nothing here changes the
running process. :func:`preload_env` gives the environment for a child process, and
``python -m comlrl_core.models.cpu.allocator --exports tcmalloc`` prints the shell exports
that do the same (what ``scripts/main.sh`` evaluates; ``COMLRL_ALLOCATOR=glibc`` keeps
glibc's), ``--library tcmalloc`` the library alone.
"""

from __future__ import annotations

import argparse
import ctypes.util
import os
import shlex
import sys
from typing import Mapping, Sequence

#: allocator name -> the library names ``ctypes.util.find_library`` looks up, in order
LIBRARIES: dict[str, tuple[str, ...]] = {
    "tcmalloc": ("tcmalloc_minimal", "tcmalloc"),
    "jemalloc": ("jemalloc",),
}
#: how to install each on Debian / Ubuntu (the error message's fix)
PACKAGES = {"tcmalloc": "libtcmalloc-minimal4", "jemalloc": "libjemalloc2"}
#: tcmalloc prints a line for every allocation above 1 GiB unless told otherwise; a model's
#: weights in one block are a normal allocation here
_QUIET_TCMALLOC = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(1 << 40)}


def _check_name(name: str) -> None:
    if name not in LIBRARIES:
        raise ValueError(f"unknown allocator {name!r}: choose one of {sorted(LIBRARIES)} (or glibc: no preload)")


def find_library(name: str) -> str | None:
    """The library file (a soname the dynamic loader resolves) of allocator ``name``, or None."""
    _check_name(name)
    for candidate in LIBRARIES[name]:
        found = ctypes.util.find_library(candidate)
        if found:
            return found
    return None


def loaded_allocator(maps_text: str | None = None) -> str:
    """``"tcmalloc"``, ``"jemalloc"`` or ``"glibc"``: the allocator mapped into this process
    (read from ``/proc/self/maps``, or from ``maps_text``); ``"unknown"`` off Linux."""
    if maps_text is None:
        try:
            with open("/proc/self/maps") as maps:
                maps_text = maps.read()
        except OSError:
            return "unknown"
    found = {_allocator_of(line) for line in maps_text.splitlines() if "/" in line}
    return next((name for name in LIBRARIES if name in found), "glibc")


def _allocator_of(path: str) -> str | None:
    """The allocator whose library ``path`` is (``/usr/lib/libtcmalloc_minimal.so.4`` -> tcmalloc), or None."""
    filename = path.rsplit("/", 1)[-1]
    for name, candidates in LIBRARIES.items():
        if any(filename.startswith(f"lib{candidate}.") for candidate in candidates):
            return name
    return None


def preload_env(name: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: this process's) that starts a child process on allocator
    ``name``: its library first in ``LD_PRELOAD``, any other allocator's removed (``"glibc"``:
    only removed). Raises FileNotFoundError with the package to install when the library is
    not on this machine."""
    out = dict(os.environ if env is None else env)
    kept = [p for p in out.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p and _allocator_of(p) is None]
    if kept:
        out["LD_PRELOAD"] = ":".join(kept)
    else:
        out.pop("LD_PRELOAD", None)
    if name == "glibc":
        return out
    library = find_library(name)
    if library is None:
        raise FileNotFoundError(
            f"allocator {name!r}: no {'/'.join('lib' + n for n in LIBRARIES[name])} library on this machine; "
            f"install it (Debian/Ubuntu: apt-get install {PACKAGES[name]}) or use glibc's malloc"
        )
    out["LD_PRELOAD"] = ":".join([library, *kept])
    if name == "tcmalloc":
        for key, value in _QUIET_TCMALLOC.items():
            out.setdefault(key, value)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Show how to start a process on another C allocator.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--library", choices=sorted(LIBRARIES), help="print the library LD_PRELOAD needs")
    what.add_argument("--exports", choices=sorted(LIBRARIES), help="print the shell exports that start a process on it")
    args = parser.parse_args(argv)
    name = args.library or args.exports
    if find_library(name) is None:
        print(f"no {name} library found (apt-get install {PACKAGES[name]})", file=sys.stderr)
        return 1
    if args.library:
        print(find_library(name))
        return 0
    env = preload_env(name)
    for key in sorted(key for key in env if env[key] != os.environ.get(key)):
        print(f"export {key}={shlex.quote(env[key])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
