"""Value types and errors of the remote-model client (:mod:`comlrl_core.remote.client`).

Kept apart from the client so that the format back ends (:mod:`comlrl_core.remote.formats`)
and the client can both use them without importing each other.

Error hierarchy (all carry ``status``, the HTTP status when there was one, and ``attempts``,
the number of HTTP attempts made for the failing request)::

    RemoteModelError
    ├── RemoteRequestError       the server refused the request (4xx other than 408/409/429)
    │   └── RemoteAuthError      401 / 403, or no key in the configured environment variable
    ├── RemoteResponseError      a success status with a body we cannot read
    └── RemoteUnavailableError   retries exhausted on 408/409/429/5xx, timeouts, connection errors

Messages name the status and the server's own error message, and never contain the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

RemoteFinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class RemoteCompletion:
    """One candidate returned by a remote model.

    ``finish_reason`` is ``"length"`` when the server reports that the token budget cut the
    text short (OpenAI ``finish_reason="length"``, Anthropic ``stop_reason="max_tokens"``,
    Responses ``incomplete_details.reason="max_output_tokens"``), else ``"stop"``.
    """

    text: str
    finish_reason: RemoteFinishReason = "stop"


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings after overrides. ``None`` means "do not send"."""

    max_tokens: int
    temperature: float | None
    top_p: float | None


@dataclass(frozen=True)
class RequestContext:
    """What a request is for, beyond the prompt: sent by the ``generic`` format (CoMLRL's
    ``agent_idx`` and ``batch_item``), ignored by the SDK formats.

    ``task_item`` is already JSON-ready (see :func:`comlrl_core.remote.client.json_ready`).
    """

    agent_index: int | None = None
    task_item: Any = None


class RemoteModelError(RuntimeError):
    """Base class of every error raised by the remote-model client."""

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.attempts = attempts


class RemoteRequestError(RemoteModelError):
    """The server rejected the request (a 4xx that retrying cannot fix)."""


class RemoteAuthError(RemoteRequestError):
    """Missing or rejected credentials (401 / 403, or the key's variable is unset)."""


class RemoteResponseError(RemoteModelError):
    """The server answered with a success status but a body we cannot read."""


class RemoteUnavailableError(RemoteModelError):
    """The endpoint kept failing transiently until the retry budget ran out."""


FailureKind = Literal["transient", "request", "response"]


class BackendFailure(Exception):
    """Internal: one failed HTTP attempt, classified by a format back end.

    The client decides what to do with it (retry, or raise a public error with the key
    redacted and the attempt count filled in); it never escapes the client.
    """

    def __init__(
        self,
        kind: FailureKind,
        message: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retry_after_s = retry_after_s
