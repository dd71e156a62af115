"""Small C kernels compiled on first use, for this CPU, and kept in a per-machine cache.

The CPU kernels (:mod:`~comlrl_core.models.cpu.decode_attention`,
:mod:`~comlrl_core.models.cpu.row_products`) each carry their C source. :func:`load`
compiles one with the machine's C compiler (``$CC``, else ``cc`` or ``gcc``) as
``-O3 -march=native -fopenmp``, into ``$COMLRL_CACHE/kernels`` (default
``~/.cache/comlrl``), under a name made from the source, the compiler and its version,
the flags and the CPU's feature flags: a shared home directory never loads a library
built for another CPU. The build is atomic (compiled in a scratch folder, then renamed),
so a failed or interrupted build leaves nothing a later process could load.

The libraries run on torch's own OpenMP runtime: their ``libgomp.so.1`` resolves to the
one torch loaded. :func:`load` refuses where torch is not on one GNU OpenMP runtime, and
where loading the library brought a second one (two thread pools fighting for the cores).

Public API::

    load(name, source) -> ctypes.CDLL | Unavailable  (Unavailable.expected: a machine
                                                       without what it needs, not a fault)
    probed_kernel(name, source, env_var, bind, probe, log, what, fallback) -> kernel | str
    switched_off(env_var) -> bool  ("off", "0", "false" or "no")
    compiler() -> str | None
    library_path(name, source, compiler) -> str
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from typing import Callable, NamedTuple, TypeVar

KernelT = TypeVar("KernelT")

FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
_COMPILE_TIMEOUT_S = 120


class Unavailable(NamedTuple):
    """Why a kernel library is not loaded. ``expected``: the machine lacks what it needs
    (not Linux, no compiler, another OpenMP runtime), so the caller need not warn."""

    reason: str
    expected: bool


def switched_off(env_var: str) -> bool:
    """Whether the environment variable switches a kernel off."""
    return os.environ.get(env_var, "").strip().lower() in ("off", "0", "false", "no")


def compiler() -> str | None:
    """The C compiler: ``$CC``, else ``cc`` or ``gcc`` on the PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def openmp_libraries() -> set[str]:
    """The OpenMP runtimes mapped into this process (by file)."""
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        return {line.split()[-1] for line in maps if "libgomp" in line or "libiomp" in line or "libomp" in line}


def cpu_flags() -> str:
    """The CPU's feature flags as /proc/cpuinfo lists them ("" where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            return next((line for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def library_path(name: str, source: str, compiler_path: str) -> str:
    """Where ``source``, compiled by ``compiler_path`` with :data:`FLAGS` for this CPU, is kept."""
    version = subprocess.run([compiler_path, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = "\n".join([source, compiler_path, version.splitlines()[0] if version else "", " ".join(FLAGS)])
    key += "\n" + platform.machine() + "\n" + cpu_flags()
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    root = os.environ.get("COMLRL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "comlrl")
    return os.path.join(root, "kernels", f"{name}-{digest}.so")


def _build(name: str, source: str, compiler_path: str, target: str) -> None:
    """Compile ``source`` to ``target`` (atomically: a half-written library never loads)."""
    folder = os.path.dirname(target)
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        source_file = os.path.join(scratch, f"{name}.c")
        with open(source_file, "w", encoding="utf-8") as handle:
            handle.write(source)
        built = os.path.join(scratch, f"{name}.so")
        result = subprocess.run(
            [compiler_path, *FLAGS, "-o", built, source_file],
            capture_output=True,
            text=True,
            timeout=_COMPILE_TIMEOUT_S,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{os.path.basename(compiler_path)} failed: {result.stderr.strip()[-400:]}")
        os.replace(built, target)


def load(name: str, source: str) -> ctypes.CDLL | Unavailable:
    """The library compiled from ``source`` (built on the first call on this machine, then
    loaded from the cache), or why there is none."""
    if not sys.platform.startswith("linux"):
        return Unavailable("not on Linux", expected=True)
    compiler_path = compiler()
    if compiler_path is None:
        return Unavailable("no C compiler ($CC, cc or gcc)", expected=True)
    runtimes = openmp_libraries()
    if len(runtimes) != 1 or "libgomp" not in next(iter(runtimes)):
        found = sorted(runtimes) or "none found"
        return Unavailable(f"torch does not run on one GNU OpenMP runtime here ({found})", expected=True)
    try:
        path = library_path(name, source, compiler_path)
        if not os.path.exists(path):
            _build(name, source, compiler_path, path)
        library = ctypes.CDLL(path)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return Unavailable(f"it could not be built or loaded: {exc}", expected=False)
    if openmp_libraries() != runtimes:  # it brought a second runtime: two thread pools
        extra = sorted(openmp_libraries() - runtimes)
        return Unavailable(f"it loads another OpenMP runtime than torch's ({extra})", expected=False)
    return library


def probed_kernel(
    name: str,
    source: str,
    env_var: str,
    bind: Callable[[ctypes.CDLL], KernelT],
    probe: Callable[[KernelT], str | None],
    log: logging.Logger,
    what: str,
    fallback: str,
) -> KernelT | str:
    """A kernel module's loaded and probed kernel (``bind`` types the library's entry
    points; ``probe`` returns None when it agrees with the reference), or why there is
    none. Logged on ``log``: DEBUG where the machine or ``env_var`` rules it out, one
    WARNING ("the <what> is off, <fallback>: <reason>") where it should have run and did
    not (a failed build or load, a second OpenMP runtime, a failed probe), INFO when on."""
    if switched_off(env_var):
        log.debug("the %s is off: %s is off", what, env_var)
        return f"{env_var} is off"
    library = load(name, source)
    problem: str | None
    if isinstance(library, Unavailable):
        if library.expected:
            log.debug("the %s is off: %s", what, library.reason)
            return library.reason
        problem = library.reason
    else:
        try:
            kernel = bind(library)
        except AttributeError as exc:
            problem = f"it could not be loaded: {exc}"
        else:
            problem = probe(kernel)
            if problem is None:
                log.info("%s on (%s)", what, library._name)
                return kernel
    log.warning("the %s is off, %s: %s", what, fallback, problem)
    return problem
