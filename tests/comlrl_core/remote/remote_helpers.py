"""Shared pieces of the remote-client tests: the test key, configs and clients aimed at a
:class:`~fake_llm_server.FakeLLMServer` (fixtures live in this folder's ``conftest.py``)."""

from __future__ import annotations

from fake_llm_server import FakeLLMServer

from comlrl_core.remote.client import RemoteModelClient, RemoteModelConfig

KEY_ENV = "COMLRL_TEST_LLM_KEY"
KEY = "sk-test-secret-4f9a1c"
FORMATS = ["openai", "anthropic", "openai_responses", "generic"]
PATHS = {
    "openai": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "openai_responses": "/v1/responses",
    "generic": "/generate",
}


class SleepRecorder:
    """Records requested waits instead of sleeping, so backoff tests are instant and exact."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def make_config(server: FakeLLMServer, fmt: str, **overrides) -> RemoteModelConfig:
    # the API root of each format (the full endpoint URLs are tested in test_config.py)
    urls = {"generic": server.generic_url, "anthropic": server.url}
    options = dict(
        format=fmt,
        model="test-model",
        base_url=urls.get(fmt, server.base_url),
        api_key_env=KEY_ENV,
        timeout_s=2.0,
        max_retries=2,
        backoff_base_s=0.001,
        backoff_max_s=0.002,
    )
    if fmt == "generic":
        options["response_field"] = "outputs"
    options.update(overrides)
    return RemoteModelConfig(**options)


def make_client(server: FakeLLMServer, fmt: str, sleep=None, **overrides) -> RemoteModelClient:
    config = make_config(server, fmt, **overrides)
    return RemoteModelClient(config, sleep=sleep) if sleep else RemoteModelClient(config)


def key_header(headers: dict[str, str]) -> str:
    return headers.get("x-api-key") or headers.get("authorization", "")
