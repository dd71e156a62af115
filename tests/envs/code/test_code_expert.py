"""expert_edits: remote and local experts, and degradation when the expert fails."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from code_fakes import FakeSandbox
from fake_llm_server import FakeLLMServer

from comlrl_core.policy import Completion, Policy
from envs.code import CoopCodeEnv
from envs.code.expert import Expert, parse_edits

TASK = {
    "task_id": "custom/neg",
    "prompt": "def negate_all(xs):\n    '''Negate every number.'''\n",
    "entry_point": "negate_all",
    "test": "def check(candidate):\n    assert candidate([1]) == [-1]\n    assert candidate([]) == []\n",
}
ACTIONS = {"aux": "def aux(x):\n    return x\n", "main": "def negate_all(xs):\n    return [aux(x) for x in xs]\n"}
REPLY = "### aux\nReturn -x instead of x.\n### main\nno changes"


class _Handler(BaseHTTPRequestHandler):
    status = 200
    received: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).received.append((self.path, body))
        if self.status != 200:
            payload = {"error": {"message": "boom", "type": "server_error"}}
        else:
            payload = {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "m"),
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": REPLY}}],
            }
        data = json.dumps(payload).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    def start(status):
        handler = type("H", (_Handler,), {"status": status, "received": []})
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        started.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}/v1", handler

    started: list = []
    yield start
    for srv in started:
        srv.shutdown()
        srv.server_close()


def _env(**kwargs):
    env = CoopCodeEnv(tasks=[TASK], sandbox=FakeSandbox(), num_turns=3, external_transition="expert_edits", **kwargs)
    env.reset(options={"task": 0})
    return env


def test_remote_expert_edits_reach_each_agent(server, monkeypatch):
    url, handler = server(200)
    monkeypatch.setenv("COOPCODE_TEST_KEY", "sk-test")
    env = _env(
        expert_model={"model": "deepseek-coder", "base_url": url, "api_key_env": "COOPCODE_TEST_KEY", "max_retries": 0}
    )
    obs, _, _, _, infos = env.step(ACTIONS)
    assert "Suggested edits from an expert (deepseek-coder):\nReturn -x instead of x." in obs["aux"]
    assert "Suggested edits from an expert (deepseek-coder):\nno changes" in obs["main"]
    assert infos["aux"]["expert_failures"] == 0 and infos["aux"]["expert_error"] is None
    ((path, body),) = handler.received
    assert path.endswith("/chat/completions") and body["model"] == "deepseek-coder"
    sent = body["messages"][-1]["content"]
    assert TASK["prompt"].strip() in sent and ACTIONS["aux"].strip() in sent
    assert "assert candidate([1]) == [-1]" in sent  # the failing test goes to the expert
    env.close()


def test_http_500_degrades_to_a_prompt_without_edits(server, monkeypatch):
    url, handler = server(500)
    monkeypatch.setenv("COOPCODE_TEST_KEY", "sk-test")
    env = _env(
        expert_model={"model": "deepseek-coder", "base_url": url, "api_key_env": "COOPCODE_TEST_KEY", "max_retries": 0}
    )
    obs, rewards, _, truncs, infos = env.step(ACTIONS)
    assert "No expert suggestions are available this turn." in obs["main"]
    assert "Suggested edits" not in obs["main"]
    assert infos["main"]["expert_failures"] == 1 and "500" in infos["main"]["expert_error"]
    assert rewards["main"] == infos["main"]["raw_reward"]  # scoring unaffected
    obs, _, _, _, infos = env.step(ACTIONS)
    assert infos["aux"]["expert_failures"] == 2
    assert len(handler.received) == 2


def test_missing_api_key_degrades(monkeypatch):
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)
    env = _env()  # the default: deepseek-coder on api.deepseek.com, key from DEEPSEEK_API_KEY
    obs, _, _, _, infos = env.step(ACTIONS)
    assert infos["main"]["expert_failures"] == 1 and "DEEPSEEK_API_KEY" in infos["main"]["expert_error"]
    assert "No expert suggestions" in obs["aux"]


class _FailingPolicy(Policy):
    name = "broken-expert"

    def generate(self, prompts, num_samples=1, generation_config=None, seed=None):
        raise RuntimeError("CUDA out of memory")


class _EchoPolicy(Policy):
    name = "local-expert"

    def __init__(self):
        self.prompts = []

    def generate(self, prompts, num_samples=1, generation_config=None, seed=None):
        self.prompts.extend(prompts)
        return [[Completion(text="### aux\nnegate x\n### main\nkeep the list comprehension")] for _ in prompts]


def test_failing_local_policy_degrades_and_counts():
    env = _env(expert_policy=_FailingPolicy())
    obs, _, _, _, infos = env.step(ACTIONS)
    assert infos["aux"]["expert_failures"] == 1 and "CUDA out of memory" in infos["aux"]["expert_error"]
    assert "No expert suggestions are available this turn." in obs["aux"]
    env.reset(options={"task": 0})  # the count is per episode
    _, _, _, _, infos = env.step(ACTIONS)
    assert infos["aux"]["expert_failures"] == 1


def test_local_policy_expert_is_shared_by_clones():
    policy = _EchoPolicy()
    env = _env(expert_policy=policy)
    twin = env.clone()
    assert twin._expert is env._expert
    obs, *_ = twin.step(ACTIONS)
    assert "Suggested edits from an expert (local-expert):\nnegate x" in obs["aux"]
    assert "keep the list comprehension" in obs["main"]
    assert len(policy.prompts) == 1 and env.turn == 0  # the original is untouched


def test_parse_edits_without_sections_gives_the_whole_reply_to_everyone():
    assert parse_edits("rename things", ["aux", "main"]) == {"aux": "rename things", "main": "rename things"}
    assert parse_edits("### main:\nfix it", ["aux", "main"]) == {"aux": "no changes", "main": "fix it"}


def test_expert_fields_are_in_every_turns_infos_including_the_last():
    env = CoopCodeEnv(
        tasks=[TASK],
        sandbox=FakeSandbox(),
        num_turns=2,
        external_transition="expert_edits",
        expert_policy=_FailingPolicy(),
    )
    env.reset(options={"task": 0})
    _, _, _, _, infos = env.step(ACTIONS)
    assert infos["main"]["expert_failures"] == 1 and infos["main"]["expert_error"]
    _, _, _, truncs, infos = env.step(ACTIONS)  # last turn: no transition, no expert call
    assert truncs["main"] and infos["main"]["expert_failures"] == 1 and infos["main"]["expert_error"] is None


def test_other_modes_have_no_expert_fields():
    env = CoopCodeEnv(tasks=[TASK], sandbox=FakeSandbox(), num_turns=2)
    env.reset(options={"task": 0})
    _, _, _, _, infos = env.step(ACTIONS)
    assert "expert_failures" not in infos["main"]


# -- provider routing by model name ------------------------------------------------------


@pytest.mark.parametrize(
    "model, fmt, url, key_env",
    [
        ("claude-sonnet-4-5", "anthropic", "https://api.anthropic.com/v1/messages", "ANTHROPIC_API_KEY"),
        ("Claude-3-Haiku", "anthropic", "https://api.anthropic.com/v1/messages", "ANTHROPIC_API_KEY"),
        ("gpt-4o-mini", "openai_responses", "https://api.openai.com/v1/responses", "OPENAI_API_KEY"),
        ("o3-mini", "openai_responses", "https://api.openai.com/v1/responses", "OPENAI_API_KEY"),
        ("o1", "openai_responses", "https://api.openai.com/v1/responses", "OPENAI_API_KEY"),
        ("deepseek-coder", "openai", "https://api.deepseek.com", "DEEPSEEK_API_KEY"),
        ("deepseek-reasoner", "openai", "https://api.deepseek.com", "DEEPSEEK_API_KEY"),
    ],
)
def test_expert_model_name_picks_the_provider(model, fmt, url, key_env):
    config = Expert(model).remote_config
    assert (config.format, config.base_url, config.resolved_api_key_env, config.model) == (fmt, url, key_env, model)


def test_default_expert_is_deepseek_coder():
    config = Expert().remote_config
    assert (config.model, config.format, config.resolved_api_key_env) == (
        "deepseek-coder",
        "openai",
        "DEEPSEEK_API_KEY",
    )


@pytest.mark.parametrize("model", ["qwen2.5-coder", "llama-3", "openchat"])
def test_unknown_model_name_is_refused_at_setup(model):
    with pytest.raises(ValueError, match=f"expert_model '{model}' names no known provider"):
        _env(expert_model=model)


def test_dict_keeps_the_named_provider_and_overrides_fields():
    config = Expert(
        {"model": "claude-opus-4", "base_url": "http://proxy:8080/v1/messages", "max_tokens": 99}
    ).remote_config
    assert (config.format, config.resolved_api_key_env, config.max_tokens) == ("anthropic", "ANTHROPIC_API_KEY", 99)
    assert config.base_url == "http://proxy:8080/v1/messages"
    custom = Expert({"model": "local", "format": "generic", "base_url": "http://h/x", "api_key_env": ""})
    assert custom.remote_config.format == "generic"
    with pytest.raises(ValueError, match="add format, base_url and api_key_env"):
        Expert({"model": "local", "base_url": "http://h/x"})


@pytest.mark.parametrize(
    "model, key_env, path",
    [
        ("claude-sonnet-4-5", "ANTHROPIC_API_KEY", "/v1/messages"),
        ("gpt-4o", "OPENAI_API_KEY", "/v1/responses"),
        ("deepseek-chat", "DEEPSEEK_API_KEY", "/v1/chat/completions"),
    ],
)
def test_routed_expert_sends_one_request_with_its_providers_key(model, key_env, path, monkeypatch):
    server = FakeLLMServer()
    try:
        monkeypatch.setenv(key_env, f"key-of-{key_env}")
        # the provider's own URL shape, on the local server (DeepSeek's root has no /v1)
        shape = {"/v1/chat/completions": "/v1"}.get(path, path)
        env = _env(expert_model={"model": model, "base_url": server.url + shape, "max_retries": 0})
        obs, _, _, _, infos = env.step(ACTIONS)
        env.close()
    finally:
        server.close()
    (req,) = server.requests
    assert req.path == path and req.body["model"] == model
    assert f"key-of-{key_env}" in (req.headers.get("x-api-key") or req.headers.get("authorization", ""))
    assert infos["aux"]["expert_error"] is None and f"Suggested edits from an expert ({model})" in obs["aux"]


def test_generic_expert_receives_the_task_item():
    server = FakeLLMServer()
    try:
        spec = {"model": "local", "format": "generic", "base_url": server.generic_url, "api_key_env": ""}
        env = _env(expert_model={**spec, "response_field": "outputs", "max_retries": 0})
        env.step(ACTIONS)
        env.close()
    finally:
        server.close()
    (req,) = server.requests
    assert req.body["batch_item"]["entry_point"] == "negate_all" and req.body["agent_idx"] is None
