"""Docker backend: warm, locked-down containers, each running one fork server.

Each container: no network, read-only root, a size-capped tmpfs at /tmp (the work
dirs), uid 65534, every capability dropped, no-new-privileges, and limits on memory
(memory = memory+swap), processes and CPU. The fork server is the container's PID 1 and
talks to the host over the attached stdin/stdout (Docker multiplexes stdout and stderr
on that socket with 8-byte frame headers; we demultiplex them here).

Containers carry the label ``comlrl.sandbox`` plus their owner's host, pid and process
start time: they are removed on close, at interpreter exit, and by the next Sandbox
start on this host once their owner is gone (a crash). Two live processes never remove
each other's containers.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import time
from typing import Any

from .config import SandboxConfig
from .protocol import server_source
from .worker import Worker

LABEL = "comlrl.sandbox"
_FRAME = struct.Struct(">BxxxI")
_SERVER_HEADROOM_MB = 64  # the fork server itself, beyond the program's memory_mb
REMOVE_PATIENCE_S = 90.0  # how long a closing worker keeps trying to remove its container


def _process_start_time(pid: int) -> str:
    """Start time of pid (clock ticks since boot), to tell a live owner from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def owner_labels() -> dict[str, str]:
    pid = os.getpid()
    return {
        LABEL: "1",
        f"{LABEL}.owner_host": socket.gethostname(),
        f"{LABEL}.owner_pid": str(pid),
        f"{LABEL}.owner_start": _process_start_time(pid),
    }


def owner_alive(labels: dict[str, str]) -> bool:
    """False only when the owner is certainly gone (same host, pid dead or reused)."""
    if labels.get(f"{LABEL}.owner_host") != socket.gethostname():
        return True  # another host's pool (shared engine): not ours to judge
    try:
        pid = int(labels.get(f"{LABEL}.owner_pid", ""))
    except ValueError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    start = labels.get(f"{LABEL}.owner_start", "")
    return not start or _process_start_time(pid) == start


def sandbox_containers(client) -> list:
    return client.containers.list(all=True, filters={"label": LABEL})


def remove_stale_containers(client) -> list[str]:
    """Remove sandbox containers whose owner process is gone; return their names."""
    removed = []
    for container in sandbox_containers(client):
        if not owner_alive(container.labels):
            try:
                container.remove(force=True)
                removed.append(container.name)
            except Exception:  # noqa: BLE001 - already gone, or being removed
                pass
    return removed


def container_options(config: SandboxConfig, pool_id: str = "") -> dict[str, Any]:
    """Keyword arguments for ``containers.create``: the lock-down and the limits."""
    memory = f"{config.memory_mb + config.tmpfs_mb + _SERVER_HEADROOM_MB}m"
    return dict(
        user="65534:65534",
        network_mode="none",
        read_only=True,
        tmpfs={"/tmp": f"rw,nosuid,nodev,noexec,size={config.tmpfs_mb}m,mode=1777"},
        shm_size=f"{config.tmpfs_mb}m",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        mem_limit=memory,
        memswap_limit=memory,  # equal: no swap
        pids_limit=config.pids,
        nano_cpus=int(config.cpus * 1e9),
        working_dir="/tmp",
        # One malloc arena: a program runs in threads, and each extra glibc arena would reserve
        # 64 MiB of the program's address-space limit.
        environment={"LANG": "C.UTF-8", "HOME": "/tmp", "MALLOC_ARENA_MAX": "1"},
        hostname="sandbox",
        stdin_open=True,
        tty=False,
        labels={**owner_labels(), f"{LABEL}.pool": pool_id},
    )


class DockerWorker(Worker):
    backend = "docker"

    def __init__(self, client, image: str, config: SandboxConfig, pool_id: str = "") -> None:
        super().__init__()
        self._frames = bytearray()
        self._stderr_tail = bytearray()
        # docker's attach socket and the raw socket under it (the docker library is untyped)
        self._sock: Any = None
        self._raw: Any = None
        server_cfg = dict(config.server_config(), work_root="/tmp", clean_dirs=["/tmp", "/dev/shm"], container=True)
        self.container = client.containers.create(
            image,
            command=["python3", "-I", "-c", server_source(), json.dumps(server_cfg)],
            **container_options(config, pool_id),
        )
        try:
            # Attach before start, so not a byte of the server's output is missed.
            self._sock = client.api.attach_socket(
                self.container.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
            )
            self._raw = getattr(self._sock, "_sock", self._sock)
            self.container.start()
            self.wait_ready(config.start_timeout)
        except BaseException:
            self.close()
            raise

    @property
    def worker_id(self) -> str:
        return self.container.id[:12]

    def _send_bytes(self, data: bytes) -> None:
        self._raw.settimeout(30.0)
        self._raw.sendall(data)

    def _read_stdout(self, timeout: float) -> bytes | None:
        self._raw.settimeout(max(timeout, 0.001))
        try:
            data = self._raw.recv(1 << 16)
        except socket.timeout:
            return b""
        if not data:
            return None
        self._frames += data
        out = bytearray()
        while len(self._frames) >= _FRAME.size:
            stream, size = _FRAME.unpack_from(self._frames)
            end = _FRAME.size + size
            if len(self._frames) < end:
                break
            payload = self._frames[_FRAME.size : end]
            del self._frames[:end]
            if stream == 1:
                out += payload
            else:  # the server's stderr: kept for diagnostics only
                self._stderr_tail = (self._stderr_tail + payload)[-8192:]
        return bytes(out)

    def diagnostics(self) -> str:
        return self._stderr_tail.decode("utf-8", "replace")

    def alive(self) -> bool:
        """An idle server writes nothing: a readable socket that reads empty is a dead container."""
        if self.broken or self._raw is None:
            return False
        try:
            readable, _, _ = select.select([self._raw], [], [], 0)
            if readable and not self._raw.recv(1, socket.MSG_PEEK):
                return False
        except (OSError, ValueError):
            return False
        return True

    def close(self) -> None:
        for closable in (self._raw, self._sock):
            try:
                if closable is not None:
                    closable.close()
            except OSError:
                pass
        self._raw = self._sock = None
        remove_container(self.container)


def remove_pool_containers(client, pool_id: str, patience: float = REMOVE_PATIENCE_S) -> None:
    """Remove every container of one pool: the sweep at close (a container created while the
    engine was going down can outlive its worker's own removal attempt)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            containers = client.containers.list(all=True, filters={"label": f"{LABEL}.pool={pool_id}"})
            break
        except Exception:  # noqa: BLE001 - the engine is down: try again
            if time.monotonic() > deadline:
                return
            time.sleep(0.5)
    for container in containers:
        remove_container(container, max(deadline - time.monotonic(), 1.0))


def remove_container(container, patience: float = REMOVE_PATIENCE_S) -> bool:
    """Remove a container, retrying while the engine does not answer (e.g. it restarts)."""
    import docker.errors

    deadline = time.monotonic() + patience
    delay = 0.2
    while True:
        try:
            container.remove(force=True)
            return True
        except docker.errors.NotFound:
            return True
        except Exception:  # noqa: BLE001 - the engine is down or busy: try again
            if time.monotonic() + delay > deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
