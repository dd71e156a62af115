"""A worker: one warm fork server (in a container or a local process) and its channel.

Backends subclass :class:`Worker` and provide the byte transport; this base class does
the request/reply exchange, the host-side safety deadline, and marks the worker
``broken`` (to be replaced by the pool) when its server dies, stops answering, or
reports that its container is tainted.
"""

from __future__ import annotations

import collections
import itertools
import queue
import time

from .protocol import FrameDecoder, encode_frame, lost_result, make_request, result_from_reply
from .types import Program

# Extra seconds the host waits beyond a program's timeout before it gives the server up.
REPLY_GRACE_S = 15.0
# Runs a program gets when its worker dies under it (a container killed from outside, the
# engine restarted): the first loss retries it on another worker, the second reports it lost.
MAX_ATTEMPTS = 2
PIPELINE_DEPTH = 2  # requests in flight per worker
PIPELINE_MAX_BYTES = 32 * 1024  # larger requests are sent only to an idle server


class WorkerLost(RuntimeError):
    """The fork server closed its channel or did not answer in time."""


class Worker:
    backend = ""

    def __init__(self) -> None:
        self.broken = False
        # The program this worker lost (its server died under it), to run again once on a
        # freshly started worker: another pooled one may be dying of the same cause.
        self.lost_job: tuple[int, Program, int] | None = None
        self._decoder = FrameDecoder()
        self._ids = itertools.count(1)

    # -- transport, provided by the backend ------------------------------------------
    def _send_bytes(self, data: bytes) -> None:
        raise NotImplementedError

    def _read_stdout(self, timeout: float) -> bytes | None:
        """Bytes from the server's stdout (b"" if none yet), None at end of stream."""
        raise NotImplementedError

    @property
    def worker_id(self) -> str:
        """Short name of the worker (container id or server pid), reported in Result.extra."""
        return ""

    def diagnostics(self) -> str:
        """Recent stderr of the server, for error messages."""
        return ""

    def close(self) -> None:
        raise NotImplementedError

    def alive(self) -> bool:
        """False when the server has certainly gone (checked before an idle worker is reused)."""
        return not self.broken

    # -- protocol --------------------------------------------------------------------
    def _receive(self, deadline: float) -> dict:
        while True:
            message = self._decoder.next_message()
            if message is not None:
                return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerLost("the sandbox server did not answer in time")
            data = self._read_stdout(remaining)
            if data is None:
                detail = self.diagnostics().strip()
                raise WorkerLost("the sandbox server exited" + (f": {detail[-500:]}" if detail else ""))
            self._decoder.feed(data)

    def wait_ready(self, timeout: float) -> dict:
        message = self._receive(time.monotonic() + timeout)
        if not message.get("ready"):
            raise WorkerLost(f"unexpected first message from the sandbox server: {message!r}")
        return message

    def serve(
        self,
        jobs: "queue.Queue[tuple[int, Program, int]]",
        results: list,
        default_timeout: float,
        first: "tuple[int, Program, int] | None" = None,
    ) -> None:
        """Run jobs ``(index, program, losses)`` from the queue until it is empty or we break.

        Requests are pipelined two deep: while the server runs one program the next
        request already waits in its input, hiding the host<->server round trip. Only
        small requests are sent ahead, so the host never blocks on a full pipe while the
        server blocks writing a reply. When the worker breaks, the programs sent ahead
        (innocent) go back to the queue for another worker, and so does the running one
        unless it was already lost once before: that one is left in ``lost_job`` for the pool
        slot to run first on a freshly started worker.
        """
        inflight: collections.deque[tuple[int, Program, dict, int]] = collections.deque()
        pending: tuple[int, Program, int] | None = first
        head_since = time.monotonic()
        while True:
            if pending is None and not self.broken:
                try:
                    pending = jobs.get_nowait()
                except queue.Empty:
                    pending = None
            if pending is not None and not self.broken and len(inflight) < PIPELINE_DEPTH:
                request = make_request(pending[1], next(self._ids), default_timeout)
                frame = encode_frame(request)
                if not inflight or len(frame) <= PIPELINE_MAX_BYTES:
                    if not inflight:
                        head_since = time.monotonic()
                    inflight.append((pending[0], pending[1], request, pending[2]))
                    pending = None
                    try:
                        self._send_bytes(frame)
                    except OSError as err:
                        self._lose(inflight, jobs, results, err, head_since)
                    continue
            if not inflight:
                if pending is not None:
                    jobs.put(pending)  # this worker broke: another one takes it
                return
            index, _, request, losses = inflight[0]
            try:
                reply = self._receive(head_since + request["timeout"] + REPLY_GRACE_S)
                if reply.get("id") != request["id"]:
                    raise WorkerLost(f"reply {reply.get('id')} does not match request {request['id']}")
            except (WorkerLost, OSError) as err:
                self._lose(inflight, jobs, results, err, head_since)
                continue
            inflight.popleft()
            head_since = time.monotonic()
            result = result_from_reply(reply, self.backend)
            result.extra["worker"] = self.worker_id
            if losses:
                result.extra["retried"] = losses  # its first worker died under it
            results[index] = result
            if reply.get("tainted"):
                self.broken = True  # the pool replaces it; programs sent ahead go back
                while inflight:
                    i, program, _, losses = inflight.pop()
                    jobs.put((i, program, losses))

    def _lose(self, inflight, jobs, results, err: BaseException, since: float) -> None:
        """The server died or hung: the head program runs again elsewhere (once), the
        programs sent ahead are requeued as they were."""
        self.broken = True
        index, program, _, losses = inflight.popleft()
        if losses + 1 < MAX_ATTEMPTS:
            self.lost_job = (index, program, losses + 1)  # the pool slot reruns it on a fresh worker
        else:
            message = f"the sandbox worker was lost twice running this program; last: {type(err).__name__}: {err}"
            result = lost_result(self.backend, message, time.monotonic() - since)
            result.extra["worker"] = self.worker_id
            results[index] = result
        while inflight:
            i, queued, _, queued_losses = inflight.pop()
            jobs.put((i, queued, queued_losses))
