"""The one HTTP path of every format: an ``httpx2`` transport that enforces what the client
promises, whoever builds the request (our generic back end or an SDK).

* **One deadline per attempt.** :meth:`GuardedTransport.attempt` opens a deadline of
  ``timeout_s``; every socket operation under it (connect, TLS, each write and read,
  redirect hops included) gets only the time left, so a server that drips one byte at a
  time cannot stretch a request past ``timeout_s`` (httpx's own timeouts are per socket
  operation). The deadline lives in a thread-local: a sync client does all its I/O in the
  calling thread, and the whole body is read inside :meth:`GuardedTransport.handle_request`.
* **A cap on the response body** (``max_response_bytes``, checked on the announced
  ``Content-Length``, while reading, and after gzip/deflate decoding, which is done here
  with the same cap, so a compressed bomb is never expanded).
* **Credentials never leave the configured origin.** A request to any other origin (a
  redirect) loses every credential header and every header holding the key. httpx itself
  drops only ``Authorization``; ``x-api-key`` and ``api-key`` would otherwise follow.

The transport talks to ``httpcore2`` directly because only its connection pool takes a
network back end, which is where the deadline is applied. Proxies from the environment are
therefore not used (an explicit ``httpx2.Client(transport=...)`` ignores them anyway).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import zlib
from typing import Any, Iterable, Iterator

import httpcore2
import httpx2

from comlrl_core.remote.config import CREDENTIAL_HEADERS
from comlrl_core.remote.types import BackendFailure

logger = logging.getLogger(__name__)

_DEFAULT_PORTS = {"http": 80, "https": 443}
_DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_DROPPED_RESPONSE_HEADERS = {b"content-encoding", b"content-length", b"transfer-encoding"}


def origin_of(url: str | httpx2.URL) -> tuple[str, str, int]:
    """``(scheme, host, port)`` with the scheme's default port filled in."""
    parsed = httpx2.URL(str(url))
    scheme = parsed.scheme.lower()
    return scheme, parsed.host.lower(), parsed.port or _DEFAULT_PORTS.get(scheme, 0)


class _AttemptClock:
    """The deadline of the attempt running in this thread (``None``: no deadline)."""

    def __init__(self) -> None:
        self._local = threading.local()

    @contextlib.contextmanager
    def attempt(self, seconds: float) -> Iterator[None]:
        outer = getattr(self._local, "deadline", None)
        if outer is not None:  # already inside an attempt (a redirect hop): keep its deadline
            yield
            return
        self._local.deadline = time.monotonic() + seconds
        try:
            yield
        finally:
            self._local.deadline = None

    def clip(self, timeout: float | None, expired: type[Exception]) -> float | None:
        """``timeout`` cut to the time left; raises ``expired`` once the deadline has passed."""
        deadline = getattr(self._local, "deadline", None)
        if deadline is None:
            return timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise expired("the request deadline passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore2.NetworkStream):
    def __init__(self, inner: httpcore2.NetworkStream, clock: _AttemptClock) -> None:
        self._inner = inner
        self._clock = clock

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._clock.clip(timeout, httpcore2.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._clock.clip(timeout, httpcore2.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        timeout = self._clock.clip(timeout, httpcore2.ConnectTimeout)
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, timeout), self._clock)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore2.NetworkBackend):
    def __init__(self, clock: _AttemptClock) -> None:
        self._inner = httpcore2.SyncBackend()
        self._clock = clock

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.NetworkStream:
        timeout = self._clock.clip(timeout, httpcore2.ConnectTimeout)
        stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _DeadlineStream(stream, self._clock)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.NetworkStream:
        timeout = self._clock.clip(timeout, httpcore2.ConnectTimeout)
        return _DeadlineStream(self._inner.connect_unix_socket(path, timeout, socket_options), self._clock)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


@contextlib.contextmanager
def _as_httpx_errors() -> Iterator[None]:
    """httpcore2 errors as the httpx2 errors of the same name, which the SDKs classify."""
    try:
        yield
    except httpcore2.TimeoutException as err:  # before the loop: the common case, mapped exactly
        raise getattr(httpx2, type(err).__name__, httpx2.TimeoutException)(str(err)) from err
    except Exception as err:
        for cls in type(err).__mro__:
            mapped = getattr(httpx2, cls.__name__, None)
            if isinstance(mapped, type) and issubclass(mapped, httpx2.TransportError):
                raise mapped(str(err)) from err
        raise


class GuardedTransport(httpx2.BaseTransport):
    """See the module docstring. One per client; ``set_origin`` before the first request."""

    def __init__(self, *, timeout_s: float, max_response_bytes: int, api_key: str | None, max_connections: int) -> None:
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes
        self._api_key = api_key
        self._origin: tuple[str, str, int] | None = None
        self._clock = _AttemptClock()
        self._pool = httpcore2.ConnectionPool(
            ssl_context=httpx2.create_ssl_context(),
            max_connections=max_connections,
            network_backend=_DeadlineBackend(self._clock),
        )

    def set_origin(self, url: str | httpx2.URL) -> None:
        """The only origin that may receive credentials: the configured endpoint's."""
        self._origin = origin_of(url)

    def attempt(self) -> contextlib.AbstractContextManager[None]:
        """A deadline of ``timeout_s`` for everything sent in this thread until it exits."""
        return self._clock.attempt(self.timeout_s)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self._strip_foreign_credentials(request)
        if "accept-encoding" in request.headers:
            request.headers["accept-encoding"] = "gzip, deflate"  # only what we decode with a cap
        with self.attempt():  # no-op inside an attempt opened by the back end
            core_request = httpcore2.Request(
                method=request.method,
                url=httpcore2.URL(
                    scheme=request.url.raw_scheme,
                    host=request.url.raw_host,
                    port=request.url.port,
                    target=request.url.raw_path,
                ),
                headers=request.headers.raw,
                content=request.stream,
                extensions=request.extensions,
            )
            with _as_httpx_errors():
                core_response = self._pool.handle_request(core_request)
                try:
                    raw = self._read_capped(core_response)
                finally:
                    core_response.close()
        encoding = next((v.decode("latin-1") for k, v in core_response.headers if k.lower() == b"content-encoding"), "")
        headers = [(k, v) for k, v in core_response.headers if k.lower() not in _DROPPED_RESPONSE_HEADERS]
        return httpx2.Response(
            core_response.status,
            headers=headers,
            content=self._decoded(raw, encoding.strip().lower(), core_response.status),
            extensions={k: v for k, v in core_response.extensions.items() if k != "network_stream"},
        )

    def close(self) -> None:
        self._pool.close()

    # -- internals -------------------------------------------------------------------------
    def _strip_foreign_credentials(self, request: httpx2.Request) -> None:
        if self._origin is None:
            raise RuntimeError("GuardedTransport.set_origin() was not called before the first request")
        if origin_of(request.url) == self._origin:
            return
        secret = [
            name
            for name, value in request.headers.items()
            if name.lower() in CREDENTIAL_HEADERS or (self._api_key and self._api_key in value)
        ]
        for name in secret:
            del request.headers[name]
        scheme, host, port = self._origin
        logger.warning(
            "a redirect led from the configured origin %s://%s:%d to %s://%s:%s; sent there without credentials%s",
            scheme,
            host,
            port,
            request.url.scheme,
            request.url.host,
            request.url.port or _DEFAULT_PORTS.get(request.url.scheme, ""),
            f" (removed: {', '.join(sorted({n.lower() for n in secret}))})" if secret else "",
        )

    def _too_large(self, status: int, what: str) -> BackendFailure:
        return BackendFailure(
            "response",
            f"response body {what} exceeds max_response_bytes={self.max_response_bytes} "
            "(RemoteModelConfig.max_response_bytes); not read further",
            status=status,
        )

    def _read_capped(self, response: httpcore2.Response) -> bytes:
        cap = self.max_response_bytes
        for name, value in response.headers:
            if name.lower() == b"content-length" and value.strip().isdigit() and int(value) > cap:
                raise self._too_large(response.status, f"of {int(value)} bytes (Content-Length)")
        chunks, size = [], 0
        assert isinstance(response.stream, Iterable)
        for chunk in response.stream:
            size += len(chunk)
            if size > cap:
                raise self._too_large(response.status, f"of more than {size} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def _decoded(self, raw: bytes, encoding: str, status: int) -> bytes:
        if encoding in ("", "identity") or not raw:
            return raw
        if encoding not in _DECODERS:
            raise BackendFailure(
                "response", f"response uses Content-Encoding {encoding!r}, which is not accepted", status=status
            )
        decoder = zlib.decompressobj(_DECODERS[encoding])
        try:
            body = decoder.decompress(raw, self.max_response_bytes + 1)
        except zlib.error as err:
            raise BackendFailure("response", f"response body is not valid {encoding}: {err}", status=status) from None
        if len(body) > self.max_response_bytes or decoder.unconsumed_tail:
            raise self._too_large(status, f"decoded from {encoding}")
        return body
