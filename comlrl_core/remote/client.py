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
  ``retry_after_max_s``. Other 4xx raise :class:`RemoteRequestError` at once; unreadable or
  oversized bodies raise :class:`RemoteResponseError` (not retried: the same request gets
  the same answer).

  The SDKs' own retries stay off (``max_retries=0``) and this one loop serves all four
  formats, because the SDKs lack what the config promises: their backoff is fixed
  (0.5 s doubling to 8 s, so ``backoff_base_s`` / ``backoff_max_s`` could not apply), a
  ``Retry-After`` above their fixed limit is refused or ignored instead of capped at
  ``retry_after_max_s``, their errors do not say how many attempts were made, their
  sleeps cannot be observed (``sleep=``), and a request would keep its concurrency slot
  while they back off. The ``generic`` format has no SDK and needs this loop anyway.
* **One deadline per attempt**: ``timeout_s`` bounds an attempt from connecting to the
  last body byte, however slowly the server sends (:mod:`comlrl_core.remote.transport`).
* **A bounded number of requests in flight**: one semaphore per client, shared by every
  thread that uses it, held only while a request is on the wire (not while backing off).
  Batches run on a thread pool of ``max_concurrency`` workers.
* **The key stays secret.** It is read from the environment variable named by
  ``api_key_env`` when the client is built; the config stores only that name, the client's
  repr shows only the name, error messages and logs have the key redacted, public errors
  carry no exception chain (an SDK error holds the request, headers included), the key is
  never sent to an origin other than the configured one (a redirect elsewhere loses every
  credential header), and pickling a client sends its config alone (the receiver reads the
  key from its own environment).
* **n candidates, whatever the API.** ``openai`` and ``generic`` ask for ``n`` in one
  request; when an endpoint returns fewer (some compatible servers ignore ``n``), the rest
  is requested, and later calls send one request per candidate from the start.
  ``anthropic`` and ``openai_responses`` always send one request per candidate.
* **What a request is for.** ``agent_index`` and the task item(s) given to ``complete*``
  reach ``generic`` endpoints as CoMLRL's ``agent_idx`` and ``batch_item`` (the task item
  made JSON-ready by :func:`json_ready`).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

from comlrl_core.remote.config import RemoteModelConfig, is_number
from comlrl_core.remote.formats import BACKENDS, FormatBackend
from comlrl_core.remote.types import (
    BackendFailure,
    RemoteAuthError,
    RemoteCompletion,
    RemoteModelError,
    RemoteRequestError,
    RemoteResponseError,
    RemoteUnavailableError,
    RequestContext,
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
    "json_ready",
]

logger = logging.getLogger(__name__)


def json_ready(value: Any) -> Any:
    """``value`` as JSON data: mappings and sequences recursively, array-likes through
    ``tolist()`` (numpy, torch), anything else as its ``str``."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_ready(v) for v in value]
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return json_ready(tolist())
    return str(value)


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
        agent_index: int | None = None,
        task_item: Any = None,
    ) -> list[str]:
        """``n`` candidate completions of one prompt.

        ``max_tokens``, ``temperature`` and ``top_p`` replace the config's values for this
        call (``temperature=None`` / ``top_p=None``: not sent). ``agent_index`` and
        ``task_item`` say what the prompt is for (sent by the ``generic`` format).
        """
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        rows = self.complete_batch_detailed(
            [prompt],
            n,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            agent_index=agent_index,
            task_items=[task_item],
        )
        return [c.text for c in rows[0]]

    def complete_batch(
        self,
        prompts: Sequence[str],
        n: int = 1,
        *,
        max_tokens: int | None = None,
        temperature: float | None = _UNSET,
        top_p: float | None = _UNSET,
        agent_index: int | None = None,
        task_items: Sequence[Any] | None = None,
    ) -> list[list[str]]:
        """``n`` candidates for each prompt, requested concurrently within the in-flight bound."""
        rows = self.complete_batch_detailed(
            prompts,
            n,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            agent_index=agent_index,
            task_items=task_items,
        )
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
        agent_index: int | None = None,
        task_items: Sequence[Any] | None = None,
    ) -> list[Any]:
        """Like :meth:`complete_batch`, with finish reasons (:class:`RemoteCompletion`).

        ``agent_index`` (the agent every prompt is for) and ``task_items`` (one task item per
        prompt, made JSON-ready) reach ``generic`` endpoints as ``agent_idx`` / ``batch_item``.

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
        contexts = self._contexts(len(prompts), agent_index, task_items)
        if not prompts:
            return []
        # A unit is one request (or one top-up loop) that yields `count` candidates of a prompt.
        per_unit = 1 if self._one_per_request else n
        units = [(i, per_unit) for i in range(len(prompts)) for _ in range(n // per_unit)]
        if len(units) == 1:  # no thread hop for the common single request
            i, count = units[0]
            outcomes: list[Any] = [self._guarded(self._run_unit, prompts[i], count, sampling, contexts[i])]
        else:
            futures = self._submit_all([(prompts[i], k, contexts[i]) for i, k in units], sampling)
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
        for (i, _), outcome in zip(units, outcomes, strict=False):  # shorter after a raised failure
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
        if temperature is not None and (not is_number(temperature) or temperature < 0):
            raise ValueError(f"temperature must be >= 0 or None, got {temperature!r}")
        if top_p is not None and not (is_number(top_p) and 0 < top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")
        return SamplingParams(max_tokens, temperature, top_p)

    @staticmethod
    def _contexts(count: int, agent_index: Any, task_items: Sequence[Any] | None) -> list[RequestContext]:
        if agent_index is not None and (not isinstance(agent_index, int) or isinstance(agent_index, bool)):
            raise TypeError(f"agent_index must be an int or None, got {type(agent_index).__name__}")
        if task_items is None:
            task_items = [None] * count
        elif isinstance(task_items, (str, bytes, Mapping)) or len(task_items) != count:
            raise ValueError(
                f"task_items must hold one task item per prompt ({count}), "
                f"got {type(task_items).__name__} of length {len(task_items)}"
            )
        return [RequestContext(agent_index, json_ready(item)) for item in task_items]

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Return RemoteModelErrors instead of raising them, so a batch can collect them."""
        try:
            return fn(*args)
        except RemoteModelError as e:
            with self._lock:
                self._stats["failures"] += 1
            return e

    def _run_unit(
        self, prompt: str, count: int, sampling: SamplingParams, context: RequestContext
    ) -> list[RemoteCompletion]:
        """``count`` candidates of one prompt; asks again for what a short answer left out."""
        got: list[RemoteCompletion] = []
        while len(got) < count:
            want = count - len(got)
            batch = self._request_with_retries(prompt, want, sampling, context)
            if want > 1 and len(batch) == 1 and not self._one_per_request:
                logger.info("%s answered n=%d with one candidate; sending one request per candidate", self, want)
                self._one_per_request = True
            got.extend(batch[:want])
        return got

    def _request_with_retries(
        self, prompt: str, n: int, sampling: SamplingParams, context: RequestContext
    ) -> list[RemoteCompletion]:
        cfg = self.config
        attempt = 0
        while True:
            attempt += 1
            self._check_open()
            try:
                with self._slots:
                    with self._lock:
                        self._stats["requests"] += 1
                    return self._backend.request(prompt, n, sampling, context)
            except BackendFailure as caught:
                failure = caught
            # Raised out here, not in the except block, so that the public error has no
            # __context__: the SDK exceptions behind a failure hold the request, key included.
            error = self._public_error(failure, attempt)
            if error is not None:
                raise error
            delay = self._retry_delay(attempt, failure.retry_after_s)
            where = f"{cfg.format} model {cfg.model!r}"
            message = self._redact(failure.message)
            logger.warning("%s: %s; retry %d/%d in %.2fs", where, message, attempt, cfg.max_retries, delay)
            with self._lock:
                self._stats["retries"] += 1
            self._sleep(delay)  # outside the semaphore: a waiting request holds no slot

    def _public_error(self, failure: BackendFailure, attempt: int) -> RemoteModelError | None:
        """The error to raise for ``failure``, or ``None`` when it is worth another attempt."""
        cfg = self.config
        message = self._redact(failure.message)
        where = f"{cfg.format} model {cfg.model!r}"
        if failure.kind == "request":
            cls = RemoteAuthError if failure.status in (401, 403) else RemoteRequestError
            env = cfg.resolved_api_key_env
            hint = f" (check the key in ${env})" if cls is RemoteAuthError and env else ""
            return cls(f"{where} rejected the request: {message}{hint}", status=failure.status, attempts=attempt)
        if failure.kind == "response":
            return RemoteResponseError(f"{where}: {message}", status=failure.status, attempts=attempt)
        if attempt > cfg.max_retries:
            return RemoteUnavailableError(
                f"{where} unavailable after {attempt} attempt(s): {message}", status=failure.status, attempts=attempt
            )
        return None

    def _retry_delay(self, attempt: int, retry_after_s: float | None) -> float:
        cfg = self.config
        if retry_after_s is not None:
            return min(retry_after_s, cfg.retry_after_max_s)
        ceiling = min(cfg.backoff_max_s, cfg.backoff_base_s * 2.0 ** min(attempt - 1, 64))
        with self._lock:
            return ceiling * (0.5 + 0.5 * self._rng.random())

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "***") if self._api_key else text

    def _submit_all(self, units: list[tuple[str, int, RequestContext]], sampling: SamplingParams) -> list[Future]:
        with self._lock:
            if self._closed:
                raise RemoteModelError(f"{self!r} is closed")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.config.max_concurrency, thread_name_prefix="comlrl-remote")
            # submitted under the lock, so that close() cannot shut the pool down in between
            return [self._pool.submit(self._guarded, self._run_unit, p, k, sampling, c) for p, k, c in units]

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
