"""The remote-model client against a local fake endpoint (no network beyond 127.0.0.1)."""

from __future__ import annotations

import copy
import logging
import pickle
import subprocess
import sys
import threading

import pytest
from fake_llm_server import FakeLLMServer, Scripted
from hypothesis import given, settings
from hypothesis import strategies as st
from remote_helpers import FORMATS, KEY, KEY_ENV, PATHS, SleepRecorder, key_header, make_client, make_config

from comlrl_core.remote.client import (
    RemoteAuthError,
    RemoteModelClient,
    RemoteModelConfig,
    RemoteModelError,
    RemoteRequestError,
    RemoteResponseError,
    RemoteUnavailableError,
)
from comlrl_core.remote.parsing import extract_field, parse_retry_after
from comlrl_core.remote.types import BackendFailure

# -- config ----------------------------------------------------------------------------


@pytest.mark.parametrize("alias", ["responses", "codex", "OpenAI_Responses"])
def test_format_aliases_normalise_to_openai_responses(alias):
    assert RemoteModelConfig(format=alias, model="m").format == "openai_responses"


@pytest.mark.parametrize(
    "overrides, option",
    [
        ({"format": "gopher"}, "format"),
        ({"model": " "}, "model"),
        ({"base_url": "ftp://host"}, "base_url"),
        ({"format": "generic", "base_url": None}, "base_url"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_retries": -1}, "max_retries"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"backoff_base_s": 2.0, "backoff_max_s": 1.0}, "backoff_max_s"),
        ({"response_field": "choices..text"}, "response_field"),
        ({"request_template": ["not", "a", "dict"]}, "request_template"),
        ({"extra_headers": {"Authorization": "Bearer x"}}, "extra_headers"),
        ({"extra_headers": {"X-Api-Key": "x"}}, "extra_headers"),
    ],
)
def test_config_validation_names_the_option(overrides, option):
    options = {"format": "openai", "model": "m", **overrides}
    with pytest.raises(ValueError, match=f"RemoteModelConfig.{option}"):
        RemoteModelConfig(**options)


def test_api_key_env_holding_a_key_is_refused_without_echoing_it():
    with pytest.raises(ValueError, match="api_key_env") as info:
        RemoteModelConfig(format="openai", model="m", api_key_env=KEY)
    assert KEY not in str(info.value)


def test_to_dict_round_trips_and_rejects_unknown_options(server):
    config = make_config(server, "generic", request_template={"stop": ["\n"]}, system_prompt="be brief")
    data = config.to_dict()
    assert data["api_key_env"] == KEY_ENV and KEY not in repr(data)
    assert RemoteModelConfig.from_dict(data) == config
    with pytest.raises(ValueError, match="unknown RemoteModelConfig option.*api_key\\b"):
        RemoteModelConfig.from_dict({**data, "api_key": "x"})


def test_default_key_variable_per_format():
    assert RemoteModelConfig(format="openai", model="m").resolved_api_key_env == "OPENAI_API_KEY"
    assert RemoteModelConfig(format="anthropic", model="m").resolved_api_key_env == "ANTHROPIC_API_KEY"
    assert RemoteModelConfig(format="generic", model="m", base_url="http://h/x").resolved_api_key_env is None
    assert RemoteModelConfig(format="openai", model="m", api_key_env="").resolved_api_key_env is None


# -- the key stays secret ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_key_is_sent_but_never_in_repr_or_pickle(server, fmt):
    with make_client(server, fmt) as client:
        assert client.complete("hi") == ["1.0|hi"]
        assert KEY in key_header(server.requests[0].headers)
        for text in (repr(client), str(client), repr(client.config), str(client.config.to_dict())):
            assert KEY not in text
        assert KEY_ENV in repr(client)
        blob = pickle.dumps(client)
        assert KEY.encode() not in blob
        clone = pickle.loads(blob)  # rebuilt from the config, key re-read from the environment
        try:
            assert clone.complete("again") == ["2.0|again"]
            assert KEY in key_header(server.requests[1].headers)
        finally:
            clone.close()
        assert copy.deepcopy(client) is client and copy.copy(client) is client


def test_missing_key_variable_is_a_clear_auth_error(server, monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(RemoteAuthError, match=f"{KEY_ENV}.*not set"):
        make_client(server, "openai")


def test_no_key_endpoint_sends_no_authorization(server):
    with make_client(server, "generic", api_key_env="") as client:
        client.complete("x")
    assert "authorization" not in server.requests[0].headers


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_key_echoed_by_the_server_is_redacted_everywhere(server, fmt, caplog):
    server.script(
        Scripted(status=503, body={"error": {"message": f"overloaded for key {KEY}"}}),
        Scripted(status=401, body={"error": {"message": f"invalid key {KEY}"}}),
    )
    caplog.set_level(logging.DEBUG)
    with make_client(server, fmt) as client, pytest.raises(RemoteAuthError) as info:
        client.complete("hi")
    assert info.value.status == 401 and info.value.attempts == 2
    assert "invalid key ***" in str(info.value) and f"${KEY_ENV}" in str(info.value)
    assert "overloaded for key ***" in caplog.text
    assert KEY not in str(info.value) and KEY not in caplog.text


def test_missing_sdk_names_the_extra_and_generic_needs_none(server, monkeypatch):
    monkeypatch.setitem(sys.modules, "anthropic", None)  # makes `import anthropic` fail
    monkeypatch.setitem(sys.modules, "openai", None)
    for fmt in ("anthropic", "openai", "codex"):
        with pytest.raises(ImportError, match=r"format='\w+'.*pip install 'comlrl-gym\[api\]'"):
            make_client(server, fmt)
    with make_client(server, "generic") as client:
        assert client.complete("stdlib") == ["1.0|stdlib"]


def test_importing_the_client_loads_no_sdk():
    code = (
        "import sys, comlrl_core.remote.client, comlrl_core.models.simple_policies; "
        "print(sorted(m for m in ('openai', 'anthropic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- request shapes --------------------------------------------------------------------


def test_openai_sends_n_model_messages_and_sampling(server):
    with make_client(server, "openai", system_prompt="You fix code.", temperature=0.7, top_p=0.9) as client:
        assert client.complete("fix me", n=3) == ["1.0|fix me", "1.1|fix me", "1.2|fix me"]
        client.complete("once")
    first, second = server.requests
    assert first.path == "/v1/chat/completions"
    assert first.body["n"] == 3 and first.body["model"] == "test-model"
    assert first.body["messages"] == [
        {"role": "system", "content": "You fix code."},
        {"role": "user", "content": "fix me"},
    ]
    assert (first.body["max_tokens"], first.body["temperature"], first.body["top_p"]) == (1024, 0.7, 0.9)
    assert first.headers["authorization"] == f"Bearer {KEY}"
    assert "n" not in second.body  # n=1 is every API's default; not sent


@pytest.mark.parametrize("fmt", ["anthropic", "openai_responses"])
def test_one_request_per_candidate_formats(server, fmt):
    with make_client(server, fmt, system_prompt="sys", temperature=0.5, top_p=1.0) as client:
        texts = client.complete("hello", n=3)
    assert sorted(t.split("|")[1] for t in texts) == ["hello"] * 3
    assert len(set(texts)) == 3 and len(server.requests) == 3
    for req in server.requests:
        assert req.path == PATHS[fmt] and "n" not in req.body
        assert req.body["model"] == "test-model" and req.body["temperature"] == 0.5
        assert "top_p" not in req.body  # 1.0 is the no-op value, some APIs refuse it with temperature
        assert KEY in key_header(req.headers)
        if fmt == "anthropic":
            assert req.body["messages"] == [{"role": "user", "content": "hello"}]
            assert (req.body["system"], req.body["max_tokens"]) == ("sys", 1024)
        else:
            body = req.body
            assert (body["input"], body["instructions"], body["max_output_tokens"]) == ("hello", "sys", 1024)


def test_overrides_replace_config_sampling_for_one_call(server):
    with make_client(server, "openai", temperature=1.0) as client:
        client.complete("a", max_tokens=7, temperature=0.0, top_p=0.5)
        client.complete("b")
    assert (server.requests[0].body["max_tokens"], server.requests[0].body["temperature"]) == (7, 0.0)
    assert server.requests[0].body["top_p"] == 0.5
    assert (server.requests[1].body["max_tokens"], server.requests[1].body["temperature"]) == (1024, 1.0)


@pytest.mark.parametrize(
    "field, requests_for_n3",
    [("outputs", 1), ("data.choices.*.text", 1), ("data.choices.0.text", 3)],
)
def test_generic_response_field_paths(server, field, requests_for_n3):
    with make_client(server, "generic", response_field=field) as client:
        texts = client.complete("p", n=3)
    assert len(texts) == 3 and all(t.endswith("|p") for t in texts) and len(set(texts)) == 3
    assert len(server.requests) == requests_for_n3
    assert server.requests[0].body["num_return_sequences"] == 3 and server.requests[0].body["prompt"] == "p"


def test_generic_request_template_placeholders_and_removal(server):
    template = {
        "prompt": None,  # removes the default key
        "inputs": "{prompt}",
        "parameters": {"max_new_tokens": "{max_tokens}", "label": "T={temperature}", "braces": "{kept}"},
        "n": "{n}",
    }
    with make_client(
        server, "generic", request_template=template, temperature=0.3, max_tokens=64, extra_headers={"X-Team": "blue"}
    ) as client:
        assert client.complete("write", n=2) == ["1.0|write", "1.1|write"]
    body, headers = server.requests[0].body, server.requests[0].headers
    assert "prompt" not in body and body["inputs"] == "write" and body["n"] == 2
    assert body["parameters"] == {"max_new_tokens": 64, "label": "T=0.3", "braces": "{kept}"}
    assert body["model"] == "test-model" and body["temperature"] == 0.3
    assert headers["x-team"] == "blue" and headers["authorization"] == f"Bearer {KEY}"


def test_sdk_formats_merge_request_template_into_the_body(server):
    with make_client(server, "openai", request_template={"stop": ["```"], "seed": 3}) as client:
        client.complete("x")
    assert server.requests[0].body["stop"] == ["```"] and server.requests[0].body["seed"] == 3


def test_endpoint_ignoring_n_is_topped_up_then_fanned_out(server):
    server.honour_n = False  # like a compatible server that always returns one choice
    with make_client(server, "openai") as client:
        first = client.complete("p", n=3)
        second = client.complete("q", n=2)
    assert len(first) == 3 and len(set(first)) == 3 and all(t.endswith("|p") for t in first)
    assert len(second) == 2 and all(t.endswith("|q") for t in second)
    asked = [req.body.get("n", 1) for req in server.requests]
    assert asked == [3, 2, 1, 1, 1]  # top-ups for the rest, then one request per candidate


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "openai_responses"])
def test_finish_reason_length_is_reported(server, fmt):
    with make_client(server, fmt) as client:
        rows = client.complete_batch_detailed(["cut", "fine"], n=1)
    assert [rows[0][0].finish_reason, rows[1][0].finish_reason] == ["length", "stop"]
    assert rows[1][0].text.endswith("|fine")


# -- retries and errors ----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_retry_after_is_honoured(server, fmt):
    server.script(Scripted(status=429, body={"error": {"message": "slow down"}}, headers={"Retry-After": "0.3"}))
    recorder = SleepRecorder()
    with make_client(server, fmt, sleep=recorder) as client:
        assert client.complete("hi") == ["2.0|hi"]
        assert client.stats() == {"requests": 2, "retries": 1, "failures": 0}
    assert recorder.delays == [0.3]


def test_retry_after_really_waits_between_attempts(server):
    server.script(Scripted(status=429, headers={"Retry-After": "0.25"}))
    with make_client(server, "generic") as client:
        client.complete("hi")
    first, second = server.requests
    assert second.received_at - first.received_at >= 0.25


def test_retry_after_is_capped_and_ms_header_wins(server):
    server.script(
        Scripted(status=429, headers={"Retry-After": "100"}),
        Scripted(status=503, headers={"Retry-After": "100", "retry-after-ms": "40"}),
    )
    recorder = SleepRecorder()
    with make_client(server, "openai", sleep=recorder, retry_after_max_s=0.05, max_retries=3) as client:
        client.complete("hi")
    assert recorder.delays == [0.05, pytest.approx(0.04)]


def test_backoff_is_exponential_jittered_and_capped(server):
    server.script(*[Scripted(status=500)] * 5)
    recorder = SleepRecorder()
    options = dict(max_retries=5, backoff_base_s=1.0, backoff_max_s=5.0)
    with make_client(server, "generic", sleep=recorder, **options) as client:
        assert client.complete("hi") == ["6.0|hi"]
    ceilings = [1.0, 2.0, 4.0, 5.0, 5.0]
    assert len(recorder.delays) == 5
    for delay, ceiling in zip(recorder.delays, ceilings, strict=True):
        assert 0.5 * ceiling <= delay <= ceiling


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("status", [500, 502, 429, 408])
def test_transient_statuses_exhaust_retries(server, fmt, status):
    server.script(*[Scripted(status=status, body={"error": {"message": "busy"}})] * 3)
    with make_client(server, fmt, max_retries=2) as client:
        with pytest.raises(RemoteUnavailableError, match="after 3 attempt.*busy") as info:
            client.complete("hi")
        assert client.stats() == {"requests": 3, "retries": 2, "failures": 1}
    assert (info.value.status, info.value.attempts) == (status, 3)
    assert len(server.requests) == 3


@pytest.mark.parametrize("fmt", FORMATS)
def test_timeout_is_retried(server, fmt):
    server.script(Scripted(hang=True))
    with make_client(server, fmt, timeout_s=0.3, max_retries=1) as client:
        assert client.complete("hi") == ["2.0|hi"]
        assert client.stats()["retries"] == 1


def test_timeouts_exhaust_retries(server):
    server.script(Scripted(hang=True), Scripted(hang=True))
    with make_client(server, "openai", timeout_s=0.3, max_retries=1) as client:
        with pytest.raises(RemoteUnavailableError, match="timed out") as info:
            client.complete("hi")
    assert info.value.attempts == 2 and info.value.status is None


@pytest.mark.parametrize("fmt", ["openai", "generic"])
def test_connection_refused_is_retried_then_unavailable(fmt):
    dead = FakeLLMServer()
    config = make_config(dead, fmt, max_retries=2)
    dead.close()  # nothing listens on that port any more
    with RemoteModelClient(config) as client, pytest.raises(RemoteUnavailableError, match="connection") as info:
        client.complete("hi")
    assert info.value.attempts == 3


@pytest.mark.parametrize("fmt", FORMATS)
def test_client_error_is_raised_at_once_with_the_server_message(server, fmt):
    server.script(Scripted(status=400, body={"error": {"message": "n must be <= 8", "type": "invalid_request"}}))
    expected = "rejected the request: HTTP 400: n must be <= 8"
    with make_client(server, fmt) as client, pytest.raises(RemoteRequestError, match=expected) as info:
        client.complete("hi")
    assert not isinstance(info.value, RemoteAuthError)
    assert (info.value.status, info.value.attempts) == (400, 1) and len(server.requests) == 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_malformed_json_is_a_response_error_not_retried(server, fmt):
    server.script(Scripted(body="{not json"))
    with make_client(server, fmt) as client, pytest.raises(RemoteResponseError, match="not valid JSON") as info:
        client.complete("hi")
    assert info.value.attempts == 1 and len(server.requests) == 1


@pytest.mark.parametrize(
    "fmt, body, expected",
    [
        ("openai", {"foo": 1}, "'choices'"),
        ("openai", {"choices": [{"message": {"content": None}}]}, "'choices.0.message.content'"),
        ("anthropic", {"content": [{"type": "tool_use"}]}, "text block"),
        ("openai_responses", {"output": []}, "'output_text'"),
        ("generic", {"result": "x"}, "'outputs'.*present keys: result"),
        ("generic", {"outputs": [1, 2]}, "'outputs', item 0 is int"),
    ],
)
def test_missing_field_errors_name_the_field(server, fmt, body, expected):
    server.script(Scripted(body=body))
    with make_client(server, fmt) as client, pytest.raises(RemoteResponseError, match=expected):
        client.complete("hi")


# -- concurrency and batches -----------------------------------------------------------------


@pytest.mark.parametrize("fmt, n", [("openai", 1), ("generic", 2), ("anthropic", 3)])
def test_batch_keeps_order_and_in_flight_bound(server, fmt, n):
    server.hold_until_in_flight = 2  # requests wait for each other: the bound is reached for sure
    prompts = [f"p{i}" for i in range(5)]
    with make_client(server, fmt, max_concurrency=2) as client:
        rows = client.complete_batch(prompts, n=n)
    assert server.max_in_flight == 2
    assert [len(row) for row in rows] == [n] * 5
    for prompt, row in zip(prompts, rows, strict=True):
        assert all(text.split("|")[1] == prompt for text in row)


def test_bound_is_shared_by_threads_using_one_client(server):
    # single requests run in the caller's thread: only the client's semaphore bounds them
    server.hold_until_in_flight = 3
    server.default_delay_s = 0.05
    with make_client(server, "openai", max_concurrency=3) as client:
        results: dict[int, list[str]] = {}

        def work(k: int) -> None:
            results[k] = [client.complete(f"t{k}-{i}")[0] for i in range(2)]

        threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert server.max_in_flight == 3 and len(server.requests) == 12
    for k in range(6):
        assert [text.split("|")[1] for text in results[k]] == [f"t{k}-{i}" for i in range(2)]


def test_batch_failure_raises_or_is_returned_per_prompt(server):
    # one worker: requests arrive in prompt order, so the scripted 400 hits prompt 1
    server.script(Scripted(), Scripted(status=400, body={"error": "bad prompt"}))
    with make_client(server, "openai", max_concurrency=1) as client:
        rows = client.complete_batch_detailed(["a", "b", "c"], return_exceptions=True)
        assert isinstance(rows[1], RemoteRequestError) and "bad prompt" in str(rows[1])
        assert [rows[0][0].text, rows[2][0].text] == ["1.0|a", "3.0|c"]
        server.script(Scripted(status=400, body={"error": "bad prompt"}))
        with pytest.raises(RemoteRequestError, match="bad prompt"):
            client.complete_batch(["a", "b", "c"])


def test_bad_arguments_and_closed_client(server):
    client = make_client(server, "openai")
    with pytest.raises(TypeError, match="list of strings"):
        client.complete_batch("one prompt")
    with pytest.raises(ValueError, match="n must be"):
        client.complete("x", n=0)
    with pytest.raises(ValueError, match="top_p"):
        client.complete("x", top_p=2.0)
    assert client.complete_batch([]) == []
    client.close()
    client.close()  # idempotent
    with pytest.raises(RemoteModelError, match="closed"):
        client.complete("x")


# -- helpers -----------------------------------------------------------------------------


@given(st.lists(st.lists(st.text(max_size=5), max_size=4), min_size=1, max_size=4))
@settings(max_examples=50, deadline=None)
def test_wildcard_path_collects_every_item(rows):
    data = {"choices": [{"texts": row} for row in rows]}
    assert extract_field(data, "choices.*.texts") == [t for row in rows for t in row]
    assert extract_field(data, f"choices.{len(rows) - 1}.texts") == rows[-1]
    with pytest.raises(BackendFailure, match=f"missing at 'choices.{len(rows)}'"):
        extract_field(data, f"choices.{len(rows)}.texts")


def test_retry_after_parsing():
    assert parse_retry_after({"Retry-After": "2"}) == 2.0
    assert parse_retry_after({"retry-after-ms": "1500"}) == 1.5
    assert parse_retry_after({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past
    assert parse_retry_after({"Retry-After": "soon"}) is None
    assert parse_retry_after({}) is None
