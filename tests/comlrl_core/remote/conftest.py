import pytest
from fake_llm_server import FakeLLMServer
from remote_helpers import KEY, KEY_ENV


@pytest.fixture
def server():
    srv = FakeLLMServer()
    yield srv
    srv.close()


@pytest.fixture
def other_server():
    """A second endpoint on another port: another origin."""
    srv = FakeLLMServer()
    yield srv
    srv.close()


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
