"""A client for remote LLMs: expert models, API comparators, evaluation teams.

    config = RemoteModelConfig(format="openai", model="deepseek-coder",
                               base_url="https://api.deepseek.com", api_key_env="DEEPSEEK_API_KEY")
    with RemoteModelClient(config) as client:
        edits = client.complete("Fix this function: ...", n=2)          # list[str]
        many = client.complete_batch(["prompt a", "prompt b"], n=2)     # list[list[str]]

What the client guarantees, whatever the format (see :mod:`comlrl_core.remote.formats`):

* **One retry policy.** 408, 409, 429, 5xx, timeouts and connection errors are retried up
  to ``max_retries`` times with exponential backoff and jitter, capped at ``backoff_max_s``;
  a server's ``Retry-After`` (or ``retry-after-ms``) replaces the backoff, capped at
  ``retry_after_max_s``. The SDKs' own retries are off, so no request is retried twice over.
  Other 4xx raise :class:`RemoteRequestError` at once; unreadable bodies raise
  :class:`RemoteResponseError` (not retried: the same request gets the same answer).
* **A bounded number of requests in flight**: one semaphore per client, shared by every
  thread that uses it, held only while a request is on the wire (not while backing off).
  Batches run on a thread pool of ``max_concurrency`` workers.
* **The key stays secret.** It is read from the environment variable named by
  ``api_key_env`` when the client is built; the config stores only that name, the client's
  repr shows only the name, error messages and logs have the key redacted, and pickling a
  client sends its config alone (the receiver reads the key from its own environment).
* **n candidates, whatever the API.** ``openai`` and ``generic`` ask for ``n`` in one
  request; when an endpoint returns fewer (some compatible servers ignore ``n``), the rest
  is requested, and later calls send one request per candidate from the start.
  ``anthropic`` and ``openai_responses`` always send one request per candidate.
"""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Sequence

from comlrl_core.remote.formats import BACKENDS, FormatBackend
from comlrl_core.remote.types import (
    BackendFailure,
    RemoteAuthError,
    RemoteCompletion,
    RemoteModelError,
    RemoteRequestError,
    RemoteResponseError,
    RemoteUnavailableError,
    SamplingParams,
)

__all__ = [
    "RemoteModelConfig",
    "RemoteModelClient",
    "RemoteCompletion",
    "RemoteModelError",
    "RemoteRequestError",
    "RemoteAuthError",
    "RemoteResponseError",
    "RemoteUnavailableError",
]

logger = logging.getLogger(__name__)

FORMATS = tuple(BACKENDS)
FORMAT_ALIASES = {"responses": "openai_responses", "codex": "openai_responses"}
# Where the key lives when api_key_env is not given (generic endpoints: no key).
DEFAULT_API_KEY_ENV = {
    "openai": "OPENAI_API_KEY",
    "openai_responses": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "proxy-authorization"})


@dataclass(frozen=True)
class RemoteModelConfig:
    """Settings of a :class:`RemoteModelClient`. Holds no secret, so it is safe to log and save.

    Args:
        format: ``generic``, ``openai``, ``anthropic`` or ``openai_responses``
            (aliases ``responses``, ``codex``).
        model: the model name sent to the endpoint.
        base_url: the API root (``openai``: e.g. ``https://api.deepseek.com``; default the
            SDK's), or for ``generic`` the full endpoint URL (required).
        api_key_env: NAME of the environment variable that holds the key. ``None`` uses
            ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY`` (``generic``: no key); ``""`` means
            the endpoint needs no key.
        max_tokens: completion token budget per candidate.
        temperature, top_p: sampling; ``None`` is not sent (the server's default applies).
        timeout_s: per-request timeout in seconds.
        max_retries: retries after the first attempt on transient failures.
        backoff_base_s, backoff_max_s: retry ``k`` waits ``min(max, base * 2**(k-1))``
            scaled by a random factor in [0.5, 1] (jitter, so that clients spread out).
        retry_after_max_s: cap on a server-requested ``Retry-After`` wait.
        max_concurrency: requests in flight at once, per client.
        response_field: ``generic`` only: dotted path to the completions in the response
            (``"outputs"``, ``"choices.0.text"``, ``"choices.*.text"``).
        request_template: dict deep-merged into the request body. ``generic``: string values
            may use ``{prompt}``, ``{n}``, ``{model}``, ``{max_tokens}``, ``{temperature}``,
            ``{top_p}``, ``{system_prompt}``, and a ``None`` value removes a default key. SDK
            formats: sent as extra body fields.
        extra_headers: additional HTTP headers (never credentials: use ``api_key_env``).
        system_prompt: a system instruction sent with every prompt.
    """

    format: str
    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    max_tokens: int = 1024
    temperature: float | None = None
    top_p: float | None = None
    timeout_s: float = 60.0
    max_retries: int = 4
    backoff_base_s: float = 0.5
    backoff_max_s: float = 16.0
    retry_after_max_s: float = 60.0
    max_concurrency: int = 4
    response_field: str = "choices.*.text"
    request_template: dict[str, Any] | None = None
    extra_headers: dict[str, str] | None = None
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        fmt = FORMAT_ALIASES.get(str(self.format).lower(), str(self.format).lower())
        if fmt not in BACKENDS:
            raise ValueError(
                f"RemoteModelConfig.format must be one of {', '.join(FORMATS)} "
                f"(aliases: {', '.join(FORMAT_ALIASES)}); got {self.format!r}"
            )
        object.__setattr__(self, "format", fmt)  # store the canonical name
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError("RemoteModelConfig.model must be a non-empty model name, e.g. 'deepseek-coder'")
        if self.base_url is not None and not re.match(r"https?://[^/\s]+", str(self.base_url)):
            raise ValueError(f"RemoteModelConfig.base_url must be an http(s) URL, got {self.base_url!r}")
        if fmt == "generic" and not self.base_url:
            raise ValueError(
                "RemoteModelConfig.base_url is required for format 'generic': "
                "the full URL of the JSON endpoint, e.g. 'http://localhost:8000/generate'"
            )
        if self.api_key_env not in (None, "") and not (
            isinstance(self.api_key_env, str) and _ENV_NAME.fullmatch(self.api_key_env)
        ):
            # never echo the value: a user may have pasted the key itself here
            raise ValueError(
                "RemoteModelConfig.api_key_env must NAME the environment variable that holds the key "
                "(letters, digits, underscores, e.g. 'DEEPSEEK_API_KEY'), not contain the key itself"
            )
        _check_int(self.max_tokens, "max_tokens", 1)
        _check_int(self.max_retries, "max_retries", 0)
        _check_int(self.max_concurrency, "max_concurrency", 1)
        if self.temperature is not None:
            _check_number(self.temperature, "temperature", 0.0, "(0 = greedy; None = server default)")
        if self.top_p is not None and not (_is_number(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"RemoteModelConfig.top_p must be in (0, 1] or None, got {self.top_p!r}")
        if not (_is_number(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"RemoteModelConfig.timeout_s must be > 0 seconds, got {self.timeout_s!r}")
        _check_number(self.backoff_base_s, "backoff_base_s", 0.0, "seconds")
        _check_number(self.backoff_max_s, "backoff_max_s", 0.0, "seconds")
        _check_number(self.retry_after_max_s, "retry_after_max_s", 0.0, "seconds")
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError(
                f"RemoteModelConfig.backoff_max_s ({self.backoff_max_s}) must be >= "
                f"backoff_base_s ({self.backoff_base_s})"
            )
        if not isinstance(self.response_field, str) or not all(self.response_field.split(".")):
            raise ValueError(
                f"RemoteModelConfig.response_field must be a dotted path like 'choices.0.text' or 'outputs', "
                f"got {self.response_field!r}"
            )
        if self.request_template is not None and not isinstance(self.request_template, dict):
            raise ValueError(
                f"RemoteModelConfig.request_template must be a dict merged into the request body, "
                f"got {type(self.request_template).__name__}"
            )
        if self.extra_headers is not None:
            if not isinstance(self.extra_headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.extra_headers.items()
            ):
                raise ValueError("RemoteModelConfig.extra_headers must be a dict of header name -> string value")
            secret = sorted(k for k in self.extra_headers if k.lower() in _CREDENTIAL_HEADERS)
            if secret:
                raise ValueError(
                    f"RemoteModelConfig.extra_headers must not carry credentials ({', '.join(secret)}): "
                    "configs are logged and saved; put the key in an environment variable "
                    "and name it with api_key_env"
                )
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ValueError("RemoteModelConfig.system_prompt must be a string or None")

    @property
    def resolved_api_key_env(self) -> str | None:
        """The variable the key is read from, or ``None`` when no key is sent."""
        if self.api_key_env == "":
            return None
        return self.api_key_env or DEFAULT_API_KEY_ENV.get(self.format)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict for logs and checkpoints (the config never holds the key)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RemoteModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"unknown RemoteModelConfig option(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**data)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(value: Any, name: str, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"RemoteModelConfig.{name} must be an integer >= {minimum}, got {value!r}")


def _check_number(value: Any, name: str, minimum: float, unit: str) -> None:
    if not _is_number(value) or value < minimum:
        raise ValueError(f"RemoteModelConfig.{name} must be a number >= {minimum} {unit}, got {value!r}")


_UNSET: Any = object()


class RemoteModelClient:
    """Thread-safe client for one remote model; see the module docstring for guarantees.

    Build it once and share it (environment clones share it by reference); ``close()``
    releases its connections and threads. Usable as a context manager.
    """

    def __init__(self, config: RemoteModelConfig, *, sleep: Callable[[float], None] = time.sleep) -> None:
        if not isinstance(config, RemoteModelConfig):
            raise TypeError(f"RemoteModelClient needs a RemoteModelConfig, got {type(config).__name__}")
        self.config = config
        self._api_key = _read_api_key(config)
        self._backend: FormatBackend = BACKENDS[config.format](config, self._api_key)
        self._sleep = sleep  # injectable so that schedulers or tests can observe the waits
        self._slots = threading.BoundedSemaphore(config.max_concurrency)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._rng = random.Random()
        self._closed = False
        # set once an endpoint answers a request for n > 1 with a single candidate
        self._one_per_request = self._backend.one_candidate_per_request
        self._stats = {"requests": 0, "retries": 0, "failures": 0}

    # -- public API ----------------------------------------------------------------------
    def complete(
        self,
        prompt: str,
        n: int = 1,
        *,
        max_tokens: int | None = None,
        temperature: float | None = _UNSET,
        top_p: float | None = _UNSET,
    ) -> list[str]:
        """``n`` candidate completions of one prompt.

        ``max_tokens``, ``temperature`` and ``top_p`` replace the config's values for this
        call (``temperature=None`` / ``top_p=None``: not sent).
        """
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        rows = self.complete_batch_detailed([prompt], n, max_tokens=max_tokens, temperature=temperature, top_p=top_p)
        return [c.text for c in rows[0]]

    def complete_batch(
        self,
        prompts: Sequence[str],
        n: int = 1,
        *,
        max_tokens: int | None = None,
        temperature: float | None = _UNSET,
        top_p: float | None = _UNSET,
    ) -> list[list[str]]:
        """``n`` candidates for each prompt, requested concurrently within the in-flight bound."""
        rows = self.complete_batch_detailed(prompts, n, max_tokens=max_tokens, temperature=temperature, top_p=top_p)
        return [[c.text for c in row] for row in rows]

    def complete_batch_detailed(
        self,
        prompts: Sequence[str],
        n: int = 1,
        *,
        max_tokens: int | None = None,
        temperature: float | None = _UNSET,
        top_p: float | None = _UNSET,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Like :meth:`complete_batch`, with finish reasons (:class:`RemoteCompletion`).

        With ``return_exceptions=True`` a prompt whose request failed gets its
        :class:`RemoteModelError` in place of its list, and the other prompts still complete;
        otherwise the first failure (in prompt order) is raised and pending requests are
        cancelled.
        """
        self._check_open()
        if isinstance(prompts, str) or not all(isinstance(p, str) for p in prompts):
            raise TypeError("prompts must be a list of strings (use complete() for a single prompt)")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be an integer >= 1, got {n!r}")
        sampling = self._sampling(max_tokens, temperature, top_p)
        if not prompts:
            return []
        # A unit is one request (or one top-up loop) that yields `count` candidates of a prompt.
        per_unit = 1 if self._one_per_request else n
        units = [(i, per_unit) for i in range(len(prompts)) for _ in range(n // per_unit)]
        if len(units) == 1:  # no thread hop for the common single request
            outcomes: list[Any] = [self._guarded(self._run_unit, prompts[units[0][0]], units[0][1], sampling)]
        else:
            futures = self._submit_all([(prompts[i], k) for i, k in units], sampling)
            outcomes = []
            for future in futures:
                try:
                    outcomes.append(future.result())
                except CancelledError:  # close() was called while we waited
                    outcomes.append(RemoteModelError(f"{self!r} was closed during the batch"))
                if isinstance(outcomes[-1], RemoteModelError) and not return_exceptions:
                    for pending in futures:
                        pending.cancel()  # no-op for requests already on the wire
                    break
        rows: list[Any] = [[] for _ in prompts]
        for (i, _), outcome in zip(units, outcomes):
            if isinstance(outcome, RemoteModelError):
                if not return_exceptions:
                    raise outcome
                rows[i] = outcome
            elif isinstance(rows[i], list):
                rows[i].extend(outcome)
        return rows

    def stats(self) -> dict[str, int]:
        """Counters since construction: HTTP ``requests`` sent, ``retries``, final ``failures``."""
        with self._lock:
            return dict(self._stats)

    def close(self) -> None:
        """Release the worker threads and connections. Later calls raise RemoteModelError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self._backend.close()

    def __enter__(self) -> "RemoteModelClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        cfg = self.config
        return (
            f"RemoteModelClient(format={cfg.format!r}, model={cfg.model!r}, base_url={cfg.base_url!r}, "
            f"api_key_env={cfg.resolved_api_key_env!r}, max_concurrency={cfg.max_concurrency})"
        )

    __str__ = __repr__

    # A client is a shared live resource: copies share it, pickles carry the config only.
    def __copy__(self) -> "RemoteModelClient":
        return self

    def __deepcopy__(self, memo: dict) -> "RemoteModelClient":
        return self

    def __reduce__(self) -> tuple:
        return (RemoteModelClient, (self.config,))

    # -- internals -------------------------------------------------------------------------
    def _sampling(self, max_tokens: int | None, temperature: Any, top_p: Any) -> SamplingParams:
        cfg = self.config
        max_tokens = cfg.max_tokens if max_tokens is None else max_tokens
        temperature = cfg.temperature if temperature is _UNSET else temperature
        top_p = cfg.top_p if top_p is _UNSET else top_p
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        if temperature is not None and (not _is_number(temperature) or temperature < 0):
            raise ValueError(f"temperature must be >= 0 or None, got {temperature!r}")
        if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")
        return SamplingParams(max_tokens, temperature, top_p)

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Return RemoteModelErrors instead of raising them, so a batch can collect them."""
        try:
            return fn(*args)
        except RemoteModelError as e:
            with self._lock:
                self._stats["failures"] += 1
            return e

    def _run_unit(self, prompt: str, count: int, sampling: SamplingParams) -> list[RemoteCompletion]:
        """``count`` candidates of one prompt; asks again for what a short answer left out."""
        got: list[RemoteCompletion] = []
        while len(got) < count:
            want = count - len(got)
            batch = self._request_with_retries(prompt, want, sampling)
            if want > 1 and len(batch) == 1 and not self._one_per_request:
                logger.info("%s answered n=%d with one candidate; sending one request per candidate", self, want)
                self._one_per_request = True
            got.extend(batch[:want])
        return got

    def _request_with_retries(self, prompt: str, n: int, sampling: SamplingParams) -> list[RemoteCompletion]:
        cfg = self.config
        attempt = 0
        while True:
            attempt += 1
            self._check_open()
            try:
                with self._slots:
                    with self._lock:
                        self._stats["requests"] += 1
                    return self._backend.request(prompt, n, sampling)
            except BackendFailure as failure:
                message = self._redact(failure.message)
                where = f"{cfg.format} model {cfg.model!r}"
                if failure.kind == "request":
                    cls = RemoteAuthError if failure.status in (401, 403) else RemoteRequestError
                    env = cfg.resolved_api_key_env
                    hint = f" (check the key in ${env})" if cls is RemoteAuthError and env else ""
                    raise cls(
                        f"{where} rejected the request: {message}{hint}", status=failure.status, attempts=attempt
                    ) from None
                if failure.kind == "response":
                    raise RemoteResponseError(f"{where}: {message}", status=failure.status, attempts=attempt) from None
                if attempt > cfg.max_retries:
                    raise RemoteUnavailableError(
                        f"{where} unavailable after {attempt} attempt(s): {message}",
                        status=failure.status,
                        attempts=attempt,
                    ) from None
                delay = self._retry_delay(attempt, failure.retry_after_s)
                logger.warning("%s: %s; retry %d/%d in %.2fs", where, message, attempt, cfg.max_retries, delay)
                with self._lock:
                    self._stats["retries"] += 1
            self._sleep(delay)  # outside the semaphore: a waiting request holds no slot

    def _retry_delay(self, attempt: int, retry_after_s: float | None) -> float:
        cfg = self.config
        if retry_after_s is not None:
            return min(retry_after_s, cfg.retry_after_max_s)
        ceiling = min(cfg.backoff_max_s, cfg.backoff_base_s * 2.0 ** min(attempt - 1, 64))
        with self._lock:
            return ceiling * (0.5 + 0.5 * self._rng.random())

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    def _submit_all(self, units: list[tuple[str, int]], sampling: SamplingParams) -> list[Future]:
        with self._lock:
            if self._closed:
                raise RemoteModelError(f"{self!r} is closed")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.config.max_concurrency, thread_name_prefix="comlrl-remote")
            # submitted under the lock, so that close() cannot shut the pool down in between
            return [self._pool.submit(self._guarded, self._run_unit, p, k, sampling) for p, k in units]

    def _check_open(self) -> None:
        if self._closed:
            raise RemoteModelError(f"{self!r} is closed")


def _read_api_key(config: RemoteModelConfig) -> str | None:
    name = config.resolved_api_key_env
    if name is None:
        return None
    key = os.environ.get(name, "").strip()
    if not key:
        raise RemoteAuthError(
            f"environment variable {name} (RemoteModelConfig.api_key_env) is not set: export your key "
            f"there, or set api_key_env='' for an endpoint that needs no key"
        )
    return key
