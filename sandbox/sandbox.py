"""Sandbox: runs batches of untrusted programs on a warm pool of workers.

    with Sandbox(backend="auto", pool_size=4) as box:
        results = box.run([Program(source, tests="assert f(1) == 2", timeout=5)])

Backends: ``docker`` (locked-down warm containers; the default where an engine
answers), ``process`` (local processes with rlimits; isolates less, see
``sandbox.process_backend``) and ``auto`` (Docker when the engine answers and the image
is available or can be built, otherwise process, with a one-time warning).

At most ``pool_size`` programs run at once, across every ``run`` call of a Sandbox.
Workers start on first use (or ``start()``), are reused across programs, and a worker
that broke or was tainted by its program is replaced before the next program. ``close``
(also called by ``with``, and at interpreter exit) stops them all.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
import uuid
import warnings
import weakref
from typing import Sequence

from .config import SandboxConfig
from .protocol import as_program
from .types import Program, Result, SandboxUnavailable
from .worker import Worker

log = logging.getLogger("sandbox")
_live: "weakref.WeakSet[Sandbox]" = weakref.WeakSet()
_fallback_warned = False
_stale_checked = False


def _pool_size(config: SandboxConfig) -> int:
    """The resolved pool size (``SandboxConfig.__post_init__`` replaces None by the default)."""
    if config.pool_size is None:
        raise ValueError("SandboxConfig.pool_size is unresolved; build the config through SandboxConfig(...)")
    return config.pool_size


def _docker_setup(config: SandboxConfig):
    """(client, image) when Docker is usable; SandboxUnavailable otherwise."""
    global _stale_checked
    from . import docker_backend, image

    client = image.docker_client(max_pool_size=_pool_size(config) + 8)
    client.api.timeout = max(120, config.start_timeout)
    tag = config.image or image.image_tag()
    if not image.image_exists(client, tag):
        if not config.build_image or config.image is not None:
            raise SandboxUnavailable(f"Docker image {tag} is missing; build it with `comlrl sandbox build-image`")
        log.warning("building the sandbox image %s (once, about a minute)", tag)
        try:
            image.build_image(client, log=log.info)
        except Exception as err:  # noqa: BLE001
            raise SandboxUnavailable(f"cannot build the sandbox image: {err}") from err
    if not _stale_checked:  # containers left by crashed processes on this host
        _stale_checked = True
        removed = docker_backend.remove_stale_containers(client)
        if removed:
            log.info("removed %d stale sandbox containers", len(removed))
    return client, tag


class Sandbox:
    """A pool of sandbox workers; see the module docstring."""

    def __init__(self, config: SandboxConfig | None = None, **overrides) -> None:
        if config is None:
            config = SandboxConfig(**overrides)
        elif overrides:
            config = dataclasses.replace(config, **overrides)
        self.config = config
        self._client = None
        self._image: str | None = None
        self.backend = self._select_backend()
        self._lock = threading.Lock()
        self._idle: queue.LifoQueue[Worker] = queue.LifoQueue()
        self._workers: set[Worker] = set()
        self._closers: list[threading.Thread] = []
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False
        self._pool_id = uuid.uuid4().hex[:16]  # labels this pool's containers (swept at close)
        _live.add(self)

    def _select_backend(self) -> str:
        global _fallback_warned
        choice = self.config.backend
        if choice == "process":
            return "process"
        try:
            self._client, self._image = _docker_setup(self.config)
            return "docker"
        except SandboxUnavailable as err:
            if choice == "docker":
                raise
            if not _fallback_warned:
                _fallback_warned = True
                warnings.warn(
                    f"sandbox: using the process backend, which isolates less than Docker ({err})",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return "process"

    # -- pool ------------------------------------------------------------------------
    def _new_worker(self) -> Worker:
        if self.backend == "docker":
            from .docker_backend import DockerWorker

            if self._image is None:
                raise SandboxUnavailable("the Docker backend has no image; this Sandbox was set up for processes")
            return DockerWorker(self._client, self._image, self.config, self._pool_id)
        from .process_backend import ProcessWorker

        return ProcessWorker(self.config)

    def _acquire(self, fresh: bool = False) -> Worker:
        """An idle worker, or a new one while the pool has room; ``fresh``: always a new one."""
        while True:
            try:
                worker = None if fresh else self._idle.get_nowait()
            except queue.Empty:
                pass
            else:
                if worker is not None:
                    if worker.alive():
                        return worker
                    self._discard(worker)  # died while idle (killed from outside): replace it
                    continue
            with self._lock:
                grow = len(self._workers) < _pool_size(self.config)
                if grow:
                    placeholder = object()  # reserve the slot while the worker starts
                    self._workers.add(placeholder)  # type: ignore[arg-type]
            if grow:
                break
            if fresh:  # make room: retire an idle worker (a new one takes its slot)
                try:
                    self._discard(self._idle.get(timeout=0.2))
                except queue.Empty:
                    pass
                continue
            try:  # all busy: wait for a release (or a slot freed by a broken worker)
                worker = self._idle.get(timeout=0.2)
            except queue.Empty:
                continue
            if worker.alive():
                return worker
            self._discard(worker)
        try:
            worker = self._start_worker()
        except BaseException:
            with self._lock:
                self._workers.discard(placeholder)
            raise
        with self._lock:
            self._workers.discard(placeholder)
            self._workers.add(worker)
        return worker

    def _start_worker(self) -> Worker:
        """A new worker; retried with backoff for up to ``start_timeout`` seconds, so that a
        restarting engine (or a transient start failure) delays programs instead of failing them."""
        deadline = time.monotonic() + self.config.start_timeout
        delay, attempts = 0.25, 0
        while True:
            attempts += 1
            try:
                return self._new_worker()
            except Exception as err:  # noqa: BLE001
                error = f"{type(err).__name__}: {err}"
            if self._closed or time.monotonic() + delay > deadline:
                raise SandboxUnavailable(f"cannot start a {self.backend} sandbox worker ({attempts} tries): {error}")
            log.warning("sandbox worker did not start (%s); retrying in %.1f s", error, delay)
            time.sleep(delay)
            delay = min(delay * 2, 4.0)

    def _discard(self, worker: Worker) -> None:
        with self._lock:
            self._workers.discard(worker)
        self._close_in_background(worker)  # a replacement starts on the next acquire

    def _release(self, worker: Worker) -> None:
        if worker.broken or self._closed:
            self._discard(worker)
        else:
            self._idle.put(worker)

    def _close_in_background(self, worker: Worker) -> None:
        thread = threading.Thread(target=worker.close, name="sandbox-close", daemon=True)
        thread.start()
        with self._lock:
            self._closers = [t for t in self._closers if t.is_alive()] + [thread]

    def _serve(self, jobs: "queue.Queue[tuple[int, Program, int]]", results: list) -> None:
        """One pool slot: take workers (replacing broken ones) until the jobs run out; a
        program whose worker died under it runs first on a freshly started worker."""
        lost = None
        while lost is not None or not jobs.empty():
            worker = self._acquire(fresh=lost is not None)
            try:
                worker.serve(jobs, results, self.config.timeout, first=lost)
            finally:
                lost, worker.lost_job = worker.lost_job, None
                self._release(worker)

    # -- public API ------------------------------------------------------------------
    def start(self) -> "Sandbox":
        """Start every pool worker now (in parallel) instead of on first use."""
        workers = list(self._pool_executor().map(lambda _: self._acquire(), range(_pool_size(self.config))))
        for worker in workers:
            self._release(worker)
        return self

    def run(self, programs: Sequence[Program | str]) -> list[Result]:
        """Run a batch of programs; results come back in the same order."""
        if self._closed:
            raise RuntimeError("this Sandbox is closed")
        batch = [as_program(p) for p in programs]  # bad input fails before anything runs
        if not batch:
            return []
        jobs: queue.Queue[tuple[int, Program, int]] = queue.Queue()  # (index, program, losses)
        for index, program in enumerate(batch):
            jobs.put((index, program, 0))
        results: list[Result | None] = [None] * len(batch)
        executor = self._pool_executor()
        slots = [executor.submit(self._serve, jobs, results) for _ in range(min(_pool_size(self.config), len(batch)))]
        for slot in slots:
            slot.result()
        assert all(r is not None for r in results), "a program was left without a result"
        return results  # type: ignore[return-value]

    def run_one(
        self,
        program: Program | str,
        tests: str | Sequence[str] | None = None,
        *,
        timeout: float | None = None,
        per_assert: bool = False,
    ) -> Result:
        """Run one program; ``tests``/``timeout``/``per_assert`` apply to a source string."""
        if isinstance(program, str):
            program = Program(source=program, tests=tests, timeout=timeout, per_assert=per_assert)
        return self.run([program])[0]

    def _pool_executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.config.pool_size, thread_name_prefix="sandbox"
                )
            return self._executor

    def close(self) -> None:
        """Stop every worker (remove the containers). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        workers = []
        while True:
            try:
                workers.append(self._idle.get_nowait())
            except queue.Empty:
                break
        with self._lock:
            workers += [w for w in self._workers if isinstance(w, Worker) and w not in workers]
            self._workers.clear()
        for worker in workers:
            self._close_in_background(worker)
        with self._lock:
            closers = list(self._closers)
        for thread in closers:
            thread.join(timeout=120)  # removal retries while the engine is restarting
        if self.backend == "docker" and self._client is not None:
            from .docker_backend import remove_pool_containers

            remove_pool_containers(self._client, self._pool_id)
        _live.discard(self)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *_exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Sandbox(backend={self.backend!r}, pool_size={self.config.pool_size}, closed={self._closed})"


@atexit.register
def _close_all() -> None:
    for box in list(_live):
        try:
            box.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
