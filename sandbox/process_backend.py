"""Process backend: the fork server as a local process, for machines without Docker.

It ISOLATES LESS THAN DOCKER. Each program still runs in a fresh forked process in its
own session, in a fresh temp dir, with rlimits on CPU time, address space, file size,
open files and (for non-root users) process count, and its whole process group is
killed when it ends or times out. Network access is cut with ``unshare -n`` (or
``unshare -r -n`` for unprivileged users) where the kernel permits; otherwise a
one-time warning says programs can reach the network. When started as root, programs
run as ``nobody`` (uid 65534) if the interpreter's files are readable by that user,
else as root (warned once).

What it does NOT give you, compared to the Docker backend: the host file system is
visible (read-only only where permissions say so), a process that escapes its process
group with ``setsid`` survives the run (its CPU rlimit ends it eventually), the process
limit is per user rather than per program (and root ignores it), and memory is bounded
per process (``RLIMIT_AS``) rather than per program tree. Use it for trusted or
semi-trusted code, tests and development; use Docker for model-generated code at scale.
"""

from __future__ import annotations

import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings

from .config import SandboxConfig
from .protocol import server_source
from .worker import Worker

NOBODY = 65534


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


_warned: set[str] = set()


@functools.lru_cache(maxsize=1)
def network_isolation() -> tuple[tuple[str, ...], str]:
    """(command prefix, mode): ``unshare -n`` ("netns"), ``unshare -r -n`` ("userns") or none."""
    unshare = shutil.which("unshare")
    if unshare:
        for prefix, mode in (((unshare, "-n"), "netns"), ((unshare, "-r", "-n"), "userns")):
            try:
                probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
            except (OSError, subprocess.SubprocessError):
                continue
            if probe.returncode == 0:
                return prefix, mode
    return (), "none"


def _readable_by_all(path: str) -> bool:
    """Whether every directory down to path lets other users in (o+x) and path is o+r."""
    path = os.path.realpath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts) + 1):
        try:
            mode = os.stat(os.sep.join(parts[:i]) or os.sep).st_mode
        except OSError:
            return False
        if not mode & 0o001:
            return False
    return bool(os.stat(path).st_mode & 0o004)


def _process_count(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return count


class ProcessWorker(Worker):
    backend = "process"

    def __init__(self, config: SandboxConfig, python: str | None = None) -> None:
        super().__init__()
        self._proc: subprocess.Popen | None = None
        self._pid = 0
        python = python or sys.executable
        prefix, net_mode = network_isolation()
        if net_mode == "none":
            _warn_once(
                "network",
                "sandbox process backend: `unshare -n` is not permitted here, "
                "so programs can reach the network; use the Docker backend to isolate them",
            )
        self._dir = tempfile.mkdtemp(prefix="comlrl-sandbox-")
        os.chmod(self._dir, 0o711)  # the per-run dirs inside belong to the program's user
        server_cfg = dict(config.server_config(), work_root=self._dir, clean_dirs=[], container=False)
        run_uid = os.geteuid()
        if run_uid == 0 and net_mode != "userns":
            stdlib = os.path.dirname(os.__file__)
            if _readable_by_all(stdlib) and _readable_by_all(python):
                run_uid = NOBODY
                server_cfg.update(run_uid=NOBODY, run_gid=NOBODY)
            else:
                _warn_once(
                    "root",
                    "sandbox process backend: running programs as root because "
                    f"{stdlib} is not readable by uid {NOBODY}; use the Docker backend",
                )
        if run_uid != 0:  # RLIMIT_NPROC counts all processes of the user; root ignores it
            server_cfg["nproc"] = _process_count(run_uid) + config.pids
        # MALLOC_ARENA_MAX: programs run in threads; extra glibc arenas would eat RLIMIT_AS
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self._dir, "MALLOC_ARENA_MAX": "1"}
        self._stderr = tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(
                [*prefix, python, "-I", "-c", server_source(), json.dumps(server_cfg)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env=env,
                cwd=self._dir,
                start_new_session=True,
            )  # own group: killed as one at close
            self._pid = self._proc.pid
            self.wait_ready(config.start_timeout)
        except BaseException:
            self.close()
            raise

    @property
    def worker_id(self) -> str:
        return f"pid {self._pid}"

    def _send_bytes(self, data: bytes) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write(data)
        self._proc.stdin.flush()

    def _read_stdout(self, timeout: float) -> bytes | None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return b""
        data = os.read(fd, 1 << 16)
        return data or None

    def alive(self) -> bool:
        return not self.broken and self._proc is not None and self._proc.poll() is None

    def diagnostics(self) -> str:
        try:
            self._stderr.seek(0)
            return self._stderr.read()[-4000:].decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.stdin is not None:  # started with stdin=PIPE
                    proc.stdin.close()  # EOF: the server returns from its loop
                proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            for stream in (proc.stdout,):
                if stream is not None:
                    stream.close()
        self._stderr.close()
        shutil.rmtree(self._dir, ignore_errors=True)
