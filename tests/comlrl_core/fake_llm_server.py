"""A scriptable local stand-in for remote LLM endpoints (test helper, stdlib only).

It listens on 127.0.0.1 with an OS-chosen port and emulates, closely enough for a client:

* ``POST /v1/chat/completions`` -- OpenAI chat completions (honours ``n`` unless told not to)
* ``POST /v1/messages``         -- Anthropic Messages (one candidate per request)
* ``POST /v1/responses``        -- OpenAI Responses (one candidate per request)
* ``POST /generate``            -- a generic JSON endpoint answering
  ``{"outputs": [...], "data": {"choices": [{"text": ...}, ...]}}``

Each candidate text is ``"<request number>.<candidate index>|<prompt>"`` so that tests can
tell which prompt and which request an answer came from.

Tests script the next responses with :meth:`FakeLLMServer.script` (a status, a body, headers,
a delay, a hang, a slow drip, an oversized or gzip-compressed body; a redirect is a 3xx status
with a ``Location`` header, e.g. to a second server, which is another origin), and read what
the client sent (POSTs, and the GETs a 302/303 redirect turns them into) from
:attr:`FakeLLMServer.requests`. The generic endpoint reads CoMLRL's body
(``num_return_sequences``; ``n`` also works).
``max_in_flight`` records the largest number of requests the server was handling at once;
``hold_until_in_flight`` makes early requests wait until that many have been in flight at
once (a bounded wait), so that a concurrency bound is reached deterministically rather than
by luck of timing.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Scripted:
    """One scripted reply. ``body=None`` means the endpoint's normal success body.

    ``body`` may be a dict (sent as JSON) or a str (sent verbatim, e.g. malformed JSON).
    ``hang`` holds the connection without answering until the server closes.
    ``drip_s`` sends the whole response (status line and headers included) one byte every
    ``drip_s`` seconds. ``stream_bytes`` sends that many bytes of body without a
    ``Content-Length`` (then closes). ``gzip`` compresses the body (``Content-Encoding: gzip``).
    """

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    hang: bool = False
    drip_s: float = 0.0
    stream_bytes: int = 0
    gzip: bool = False


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # parsed JSON, or the raw text when it was not JSON
    received_at: float  # time.monotonic() on arrival
    method: str = "POST"


class FakeLLMServer:
    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.max_in_flight = 0
        self.honour_n = True  # False emulates endpoints that return one choice whatever n is
        self.default_delay_s = 0.0
        self.hold_until_in_flight = 0  # 0 = off
        self._in_flight = 0
        self._script: list[Scripted] = []
        self._lock = threading.Lock()
        self._in_flight_changed = threading.Condition(self._lock)
        self._closing = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()

    # -- addresses -------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def generic_url(self) -> str:
        return self.url + "/generate"

    # -- scripting -------------------------------------------------------------------
    def script(self, *replies: Scripted) -> None:
        """Queue replies; each request consumes one, then normal successes resume."""
        with self._lock:
            self._script.extend(replies)

    def close(self) -> None:
        self._closing.set()  # releases hanging handlers
        with self._lock:
            self._in_flight_changed.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # -- request handling (called from handler threads) -------------------------------
    def _enter(self, request: RecordedRequest) -> Scripted:
        with self._lock:
            self.requests.append(request)
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            self._in_flight_changed.notify_all()
            reply = self._script.pop(0) if self._script else Scripted(delay_s=self.default_delay_s)
            if self.hold_until_in_flight and self.max_in_flight < self.hold_until_in_flight:
                # hold until the target was reached once; bounded, so that a client that never
                # reaches it fails the test's assertion instead of hanging it
                self._in_flight_changed.wait_for(
                    lambda: self.max_in_flight >= self.hold_until_in_flight or self._closing.is_set(),
                    timeout=2.0,
                )
            number = len(self.requests)
        return dataclasses.replace(reply, headers={**reply.headers, "X-Request-Number": str(number)})

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._in_flight_changed.notify_all()

    def _success_body(self, path: str, body: Any, number: int) -> Any:
        body = body if isinstance(body, dict) else {}
        if path == "/v1/chat/completions":
            prompt = body.get("messages", [{}])[-1].get("content", "")
            n = int(body.get("n", 1)) if self.honour_n else 1
            return {
                "id": f"chatcmpl-{number}",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", ""),
                "choices": [
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": f"{number}.{i}|{prompt}"},
                        "finish_reason": "length" if prompt == "cut" else "stop",
                    }
                    for i in range(n)
                ],
            }
        if path == "/v1/messages":
            prompt = body.get("messages", [{}])[-1].get("content", "")
            return {
                "id": f"msg_{number}",
                "type": "message",
                "role": "assistant",
                "model": body.get("model", ""),
                "content": [{"type": "text", "text": f"{number}.0|{prompt}"}],
                "stop_reason": "max_tokens" if prompt == "cut" else "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1},
            }
        if path == "/v1/responses":
            prompt = body.get("input", "")
            return {
                "id": f"resp_{number}",
                "object": "response",
                "created_at": 0,
                "model": body.get("model", ""),
                "status": "incomplete" if prompt == "cut" else "completed",
                "incomplete_details": {"reason": "max_output_tokens"} if prompt == "cut" else None,
                "output": [
                    {
                        "type": "message",
                        "id": f"msg_{number}",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": f"{number}.0|{prompt}", "annotations": []}],
                    }
                ],
                "parallel_tool_calls": False,
                "tool_choice": "auto",
                "tools": [],
            }
        # generic endpoint
        prompt = body.get("prompt", body.get("inputs", ""))
        n = int(body.get("num_return_sequences", body.get("n", 1))) if self.honour_n else 1
        texts = [f"{number}.{i}|{prompt}" for i in range(n)]
        return {"outputs": texts, "data": {"choices": [{"text": t} for t in texts]}}


def _make_handler(server: FakeLLMServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in two writes; no 40 ms stalls

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            pass

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            self._answer()

        def do_GET(self) -> None:  # noqa: N802 -- a 302/303 redirect turns a POST into a GET
            self._answer()

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length).decode("utf-8", errors="replace")
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw
            recorded = RecordedRequest(
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
                received_at=time.monotonic(),
                method=self.command,
            )
            reply = server._enter(recorded)
            try:
                if reply.hang:
                    server._closing.wait(timeout=30)
                    return
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                number = int(reply.headers["X-Request-Number"])
                payload = reply.body
                if payload is None and reply.status == 200:
                    payload = server._success_body(self.path, body, number)
                text = payload if isinstance(payload, str) else json.dumps(payload or {})
                if reply.stream_bytes:
                    self._stream(reply)
                    return
                data = gzip.compress(text.encode("utf-8")) if reply.gzip else text.encode("utf-8")
                headers = {"Content-Type": "application/json", "Content-Length": str(len(data)), **reply.headers}
                if reply.gzip:
                    headers["Content-Encoding"] = "gzip"
                if reply.drip_s:
                    self._drip(reply, headers, data)
                    return
                self.send_response(reply.status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout); nothing to answer
            finally:
                server._leave()

        def _drip(self, reply: Scripted, headers: dict[str, str], data: bytes) -> None:
            head = f"HTTP/1.1 {reply.status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
            for byte in head.encode("latin-1") + data:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                if server._closing.wait(reply.drip_s):
                    return
            self.close_connection = True

        def _stream(self, reply: Scripted) -> None:
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Connection", "close")
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            block = b'{"pad": "' + b"x" * 65536
            sent = 0
            while sent < reply.stream_bytes and not server._closing.is_set():
                chunk = block[: reply.stream_bytes - sent]
                self.wfile.write(chunk)
                sent += len(chunk)
            self.close_connection = True

    return Handler
