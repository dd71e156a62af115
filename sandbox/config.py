"""Configuration of a Sandbox: backend choice, pool size and per-program limits."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

BACKENDS = ("auto", "docker", "process")

# Stdlib modules the fork server imports once, so programs find them already loaded.
DEFAULT_PREIMPORT: tuple[str, ...] = (
    "abc",
    "array",
    "ast",
    "base64",
    "bisect",
    "calendar",
    "cmath",
    "collections",
    "collections.abc",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "enum",
    "fractions",
    "functools",
    "hashlib",
    "heapq",
    "io",
    "itertools",
    "json",
    "linecache",
    "math",
    "numbers",
    "operator",
    "queue",
    "random",
    "re",
    "statistics",
    "string",
    "struct",
    "textwrap",
    "threading",
    "time",
    "traceback",
    "typing",
    "unicodedata",
)


def default_pool_size() -> int:
    """CPUs + 2: two workers beyond the cores keep the CPUs busy while a worker waits (a
    round trip, a fork, a program that sleeps or spins until its timeout)."""
    return (os.cpu_count() or 1) + 2


@dataclass
class SandboxConfig:
    """Options of a :class:`sandbox.Sandbox`.

    ``memory_mb`` is the address-space limit of each program (``RLIMIT_AS``), so a Python
    memory bomb raises ``MemoryError``. A Docker container's cgroup gets
    ``memory_mb + tmpfs_mb + 64`` MiB (memory = memory+swap, no swap), leaving room for
    the fork server and the work dir.
    """

    backend: str = "auto"  # "auto" (Docker when an engine answers), "docker" or "process"
    pool_size: int | None = None  # warm workers = max concurrent programs; None = default_pool_size()
    timeout: float = 10.0  # default wall-clock seconds per program
    memory_mb: int = 512
    pids: int = 64  # processes per container (process backend: RLIMIT_NPROC headroom)
    cpus: float = 1.0  # CPUs per container (Docker only)
    tmpfs_mb: int = 64  # size of the work dir tmpfs (process backend: RLIMIT_FSIZE)
    output_cap: int = 64 * 1024  # bytes kept of stdout and of stderr each
    image: str | None = None  # Docker image; None = the locally built content-tagged image
    build_image: bool = True  # build the image on first use when it is missing
    preimport: tuple[str, ...] = field(default=DEFAULT_PREIMPORT)
    start_timeout: float = 60.0  # seconds to wait for a new worker to answer "ready"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(
                f"backend={self.backend!r} is not one of {BACKENDS}; use 'auto' to pick Docker when an engine answers"
            )
        if self.pool_size is None:
            self.pool_size = default_pool_size()
        if not isinstance(self.pool_size, int) or self.pool_size < 1:
            raise ValueError(f"pool_size={self.pool_size!r} must be a positive int (or None for the CPU count + 2)")
        for name, minimum in (("timeout", 0.001), ("cpus", 0.01)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < minimum:
                raise ValueError(f"{name}={value!r} must be a number >= {minimum}")
        for name, minimum in (("memory_mb", 32), ("pids", 4), ("tmpfs_mb", 1), ("output_cap", 1024)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name}={value!r} must be an int >= {minimum}")
        if self.start_timeout <= 0:
            raise ValueError(f"start_timeout={self.start_timeout!r} must be > 0")
        self.preimport = tuple(self.preimport)

    def server_config(self) -> dict:
        """The part of the configuration the fork server needs (sent as JSON)."""
        return {
            "output_cap": self.output_cap,
            "memory_bytes": self.memory_mb << 20,
            "fsize_bytes": self.tmpfs_mb << 20,
            "nofile": 256,
            "preimport": list(self.preimport),
        }
