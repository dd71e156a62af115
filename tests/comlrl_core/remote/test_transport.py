"""What the guarded transport enforces in every format: a deadline per attempt, a cap on the
response size, credentials kept to the configured origin, and no key in exception chains."""

from __future__ import annotations

import logging
import time

import pytest
from fake_llm_server import Scripted
from remote_helpers import FORMATS, KEY, PATHS, key_header, make_client

from comlrl_core.remote.client import RemoteAuthError, RemoteResponseError, RemoteUnavailableError

# -- one deadline per attempt ------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_slow_drip_cannot_outlive_the_deadline(server, fmt):
    # one byte every 0.5 s: each socket read succeeds well within any per-read timeout
    server.script(Scripted(drip_s=0.5))
    with make_client(server, fmt, timeout_s=1.0, max_retries=0) as client:
        start = time.monotonic()
        with pytest.raises(RemoteUnavailableError, match="timed out after 1s") as info:
            client.complete("hi")
        elapsed = time.monotonic() - start
    assert 0.9 <= elapsed < 2.5, f"the attempt lasted {elapsed:.2f}s with timeout_s=1"
    assert info.value.attempts == 1


def test_body_drip_after_quick_headers_is_bounded_too(server):
    # headers arrive at once (the drip starts only after them when it is short): a long body
    server.script(Scripted(body={"outputs": ["x" * 200]}, drip_s=0.05))
    with make_client(server, "generic", timeout_s=0.6, max_retries=0) as client:
        start = time.monotonic()
        with pytest.raises(RemoteUnavailableError, match="timed out"):
            client.complete("hi")
    assert time.monotonic() - start < 1.5


def test_deadline_is_per_attempt_not_per_client(server):
    server.script(Scripted(drip_s=0.5))
    with make_client(server, "openai", timeout_s=1.0, max_retries=1) as client:
        assert client.complete("hi") == ["2.0|hi"]  # the retry gets a fresh deadline
        assert client.stats()["retries"] == 1


# -- response size cap -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "reply, what",
    [
        (Scripted(body="x" * 5000), "Content-Length"),  # announced
        (Scripted(stream_bytes=10_000_000), "more than"),  # no length: counted while reading
    ],
    ids=["announced", "streamed"],
)
def test_oversized_response_is_refused_not_retried(server, fmt, reply, what):
    server.script(reply)
    with make_client(server, fmt, max_response_bytes=4096) as client:
        with pytest.raises(RemoteResponseError, match=f"max_response_bytes=4096.*|{what}") as info:
            client.complete("hi")
    assert what in str(info.value) and "max_response_bytes=4096" in str(info.value)
    assert info.value.attempts == 1 and len(server.requests) == 1


@pytest.mark.parametrize("fmt", ["generic", "anthropic"])
def test_compressed_body_is_capped_after_decoding(server, fmt):
    # 64 KiB of JSON compress to well under the cap: only the decoded size can catch it
    server.script(Scripted(body={"outputs": ["a" * 65536]}, gzip=True))
    with make_client(server, fmt, max_response_bytes=8192) as client:
        with pytest.raises(RemoteResponseError, match="decoded from gzip"):
            client.complete("hi")


def test_compressed_body_within_the_cap_is_decoded(server):
    server.script(Scripted(body={"outputs": ["zipped"]}, gzip=True))
    with make_client(server, "generic") as client:
        assert client.complete("hi") == ["zipped"]


def test_max_response_bytes_is_validated():
    from comlrl_core.remote.config import RemoteModelConfig

    with pytest.raises(ValueError, match="RemoteModelConfig.max_response_bytes"):
        RemoteModelConfig(format="openai", model="m", max_response_bytes=10)


# -- credentials stay on the configured origin -------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("status", [302, 307])
def test_cross_origin_redirect_never_carries_the_key(server, other_server, fmt, status, caplog):
    target = other_server.url + PATHS[fmt]
    server.script(Scripted(status=status, headers={"Location": target}))
    caplog.set_level(logging.WARNING)
    with make_client(server, fmt, max_retries=0) as client:
        try:
            client.complete("hi")
        except Exception:  # noqa: BLE001 -- the answer of the other origin does not matter here
            pass
    assert len(server.requests) == 1 and KEY in key_header(server.requests[0].headers)
    assert len(other_server.requests) == 1, "the redirect was not followed"
    leaked = {k: v for k, v in other_server.requests[0].headers.items() if KEY in v}
    assert leaked == {} and "authorization" not in other_server.requests[0].headers
    assert "x-api-key" not in other_server.requests[0].headers
    assert "sent there without credentials" in caplog.text and KEY not in caplog.text


@pytest.mark.parametrize("fmt", FORMATS)
def test_same_origin_redirect_keeps_the_key_and_succeeds(server, fmt):
    server.script(Scripted(status=307, headers={"Location": server.url + PATHS[fmt]}))
    with make_client(server, fmt) as client:
        assert client.complete("hi") == ["2.0|hi"]
    assert [KEY in key_header(r.headers) for r in server.requests] == [True, True]


# -- the key never rides in an exception chain ---------------------------------------------


def _chain(error: BaseException) -> list[BaseException]:
    seen, todo = [], [error]
    while todo:
        node = todo.pop()
        if node is None or any(node is s for s in seen):
            continue
        seen.append(node)
        todo += [node.__cause__, node.__context__]
    return seen


@pytest.mark.parametrize("fmt", FORMATS)
def test_key_is_absent_from_the_exception_chain(server, fmt):
    server.script(
        Scripted(status=503, body={"error": {"message": f"overloaded for {KEY}"}}),
        Scripted(status=401, body={"error": {"message": f"invalid key {KEY}"}}),
    )
    with make_client(server, fmt, max_retries=1) as client, pytest.raises(RemoteAuthError) as info:
        client.complete("hi")
    chain = _chain(info.value)
    assert len(chain) == 1, f"public errors carry no chain, got {[type(e).__name__ for e in chain]}"
    for error in chain:
        assert KEY not in str(error) and KEY not in repr(error.args)
    assert "invalid key ***" in str(info.value)


@pytest.mark.parametrize("fmt", FORMATS)
def test_transient_errors_carry_no_chain_either(server, fmt):
    server.script(Scripted(hang=True))
    with make_client(server, fmt, timeout_s=0.3, max_retries=0) as client:
        with pytest.raises(RemoteUnavailableError) as info:
            client.complete("hi")
    assert info.value.__cause__ is None and info.value.__context__ is None
