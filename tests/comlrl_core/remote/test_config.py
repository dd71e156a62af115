"""RemoteModelConfig: endpoint URLs in the shape CoMLRL documents, and their validation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from remote_helpers import KEY, KEY_ENV, PATHS, key_header

from comlrl_core.remote.client import RemoteModelClient
from comlrl_core.remote.config import ENDPOINT_PATHS, RemoteModelConfig

# The endpoint URL shapes of CoMLRL's docs, relative to the host.
DOCUMENTED = {
    "openai": "/v1/chat/completions",
    "openai_responses": "/v1/responses",
    "anthropic": "/v1/messages",
    "generic": "/generate",
}


@pytest.mark.parametrize("fmt", list(DOCUMENTED))
@pytest.mark.parametrize("trailing", ["", "/"])
def test_documented_full_endpoint_url_reaches_that_endpoint(server, fmt, trailing):
    config = RemoteModelConfig(
        format=fmt,
        model="m",
        base_url=server.url + DOCUMENTED[fmt] + (trailing if fmt != "generic" else ""),
        api_key_env=KEY_ENV,
        response_field="outputs",
    )
    with RemoteModelClient(config) as client:
        assert client.complete("hi") == ["1.0|hi"]
    assert [r.path for r in server.requests] == [PATHS[fmt]]
    assert KEY in key_header(server.requests[0].headers)


@pytest.mark.parametrize(
    "fmt, root",
    [("openai", "/v1"), ("openai_responses", "/v1"), ("anthropic", ""), ("anthropic", "/v1")],
)
def test_bare_api_root_still_works(server, fmt, root):
    config = RemoteModelConfig(format=fmt, model="m", base_url=server.url + root, api_key_env=KEY_ENV)
    with RemoteModelClient(config) as client:
        assert client.complete("hi") == ["1.0|hi"]
    assert [r.path for r in server.requests] == [PATHS[fmt]]


@pytest.mark.parametrize(
    "fmt, url, root",
    [
        ("openai", "https://api.openai.com/v1/chat/completions", "https://api.openai.com/v1"),
        ("openai", "https://api.deepseek.com", "https://api.deepseek.com"),
        ("openai", "http://localhost:8000/v1/", "http://localhost:8000/v1"),
        ("responses", "https://api.openai.com/v1/responses", "https://api.openai.com/v1"),
        ("codex", "https://api.openai.com/v1/responses/", "https://api.openai.com/v1"),
        ("anthropic", "https://api.anthropic.com/v1/messages", "https://api.anthropic.com"),
        ("anthropic", "https://api.anthropic.com/v1", "https://api.anthropic.com"),
        ("anthropic", "https://proxy.example/anthropic", "https://proxy.example/anthropic"),
        ("generic", "http://h:1/x/generate", "http://h:1/x/generate"),
    ],
)
def test_api_root_of_each_url_shape(fmt, url, root):
    assert RemoteModelConfig(format=fmt, model="m", base_url=url).api_root == root


def test_no_base_url_leaves_the_sdk_default():
    assert RemoteModelConfig(format="anthropic", model="m").api_root is None


@pytest.mark.parametrize(
    "fmt, url, named",
    [
        ("openai", "https://api.openai.com/v1/responses", "'openai_responses'"),
        ("openai_responses", "https://api.openai.com/v1/chat/completions", "'openai'"),
        ("anthropic", "https://api.openai.com/v1/chat/completions", "'openai'"),
        ("openai", "https://api.anthropic.com/v1/messages", "'anthropic'"),
    ],
)
def test_endpoint_of_another_format_is_refused_with_the_fix(fmt, url, named):
    with pytest.raises(ValueError, match=f"RemoteModelConfig.base_url.*set format={named}"):
        RemoteModelConfig(format=fmt, model="m", base_url=url)


def test_key_env_default_is_unchanged_by_the_move():
    # the config moved out of client.py; the old import path still names the same class
    from comlrl_core.remote import client, config

    assert client.RemoteModelConfig is config.RemoteModelConfig
    assert KEY not in repr(RemoteModelConfig(format="openai", model="m", api_key_env=KEY_ENV))


@given(
    fmt=st.sampled_from(["openai", "openai_responses", "anthropic"]),
    prefix=st.lists(st.from_regex(r"[a-z0-9-]{1,8}", fullmatch=True), max_size=3),
    trailing=st.booleans(),
)
@settings(max_examples=100, deadline=None)
def test_full_endpoint_url_is_exactly_where_the_sdk_posts(fmt, prefix, trailing):
    # the SDKs post to <api_root> + their endpoint path: that must be the URL the user gave
    root = "https://api.example.com" + "".join("/" + p for p in prefix)
    endpoint = root + ENDPOINT_PATHS[fmt]
    config = RemoteModelConfig(format=fmt, model="m", base_url=endpoint + ("/" if trailing else ""))
    assert config.api_root + ENDPOINT_PATHS[fmt] == endpoint
