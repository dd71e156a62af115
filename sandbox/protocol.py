"""Host side of the fork-server protocol: framing, requests, replies -> Result.

Messages are a 4-byte big-endian length plus UTF-8 JSON, both ways (see _server.py).
"""

from __future__ import annotations

import functools
import json
import struct
from pathlib import Path
from typing import Any, Sequence

from .types import AssertOutcome, Program, Result, Status

_HEADER = struct.Struct(">I")
_HERE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=1)
def server_source() -> str:
    """The fork server as one ``python -c`` source: _child.py, then _server.py."""
    child = (_HERE / "_child.py").read_text()
    server = (_HERE / "_server.py").read_text()
    return child + "\n\n" + server


def encode_frame(message: dict[str, Any]) -> bytes:
    # ensure_ascii: lone surrogates (garbage from a model) travel as \ud800 escapes
    body = json.dumps(message, ensure_ascii=True).encode("ascii")
    return _HEADER.pack(len(body)) + body


class FrameDecoder:
    """Collects bytes and returns each complete message once."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_message(self) -> dict[str, Any] | None:
        if len(self._buffer) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack_from(self._buffer)
        end = _HEADER.size + size
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[_HEADER.size : end])
        del self._buffer[:end]
        return json.loads(body)


def as_program(item: Program | str) -> Program:
    """Accept a Program or plain source; reject anything else with a clear error."""
    if isinstance(item, str):
        return Program(source=item)
    if not isinstance(item, Program):
        raise TypeError(f"expected a sandbox.Program or a source string, got {type(item).__name__}")
    if not isinstance(item.source, str):
        raise TypeError(f"Program.source must be str, got {type(item.source).__name__}")
    tests = item.tests
    if tests is not None and not isinstance(tests, str):
        if not isinstance(tests, Sequence) or not all(isinstance(t, str) for t in tests):
            raise TypeError("Program.tests must be None, a str or a sequence of str")
    if item.timeout is not None and not (isinstance(item.timeout, (int, float)) and item.timeout > 0):
        raise ValueError(f"Program.timeout={item.timeout!r} must be a positive number or None")
    return item


def make_request(program: Program, request_id: int, default_timeout: float) -> dict[str, Any]:
    tests = program.tests
    if tests is not None and not isinstance(tests, str):
        tests = list(tests)
    return {
        "id": request_id,
        "source": program.source,
        "tests": tests,
        "per_assert": bool(program.per_assert),
        "timeout": float(program.timeout if program.timeout is not None else default_timeout),
    }


def result_from_reply(reply: dict[str, Any], backend: str) -> Result:
    asserts = reply.get("asserts")
    extra = dict(reply.get("extra") or {})
    if reply.get("tainted"):
        extra["tainted"] = True
    return Result(
        status=Status(reply["status"]),
        error_type=reply.get("error_type"),
        error_message=reply.get("error_message"),
        asserts=None if asserts is None else [AssertOutcome(**a) for a in asserts],
        stdout=reply.get("stdout", ""),
        stderr=reply.get("stderr", ""),
        stdout_truncated=bool(reply.get("stdout_truncated")),
        stderr_truncated=bool(reply.get("stderr_truncated")),
        duration=float(reply.get("duration", 0.0)),
        backend=backend,
        extra=extra,
    )


def lost_result(backend: str, message: str, duration: float = 0.0) -> Result:
    """Result for a program whose worker died or stopped answering."""
    return Result(
        status=Status.KILLED,
        error_type="SandboxLost",
        error_message=message,
        duration=duration,
        backend=backend,
        extra={"tainted": True},
    )
