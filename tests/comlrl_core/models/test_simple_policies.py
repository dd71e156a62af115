"""CallablePolicy and RemotePolicy: the Policy contract without a model."""

from __future__ import annotations

import functools

import pytest
from fake_llm_server import FakeLLMServer, Scripted
from hypothesis import given, settings
from hypothesis import strategies as st

from comlrl_core.models.simple_policies import CallablePolicy, RemotePolicy
from comlrl_core.policy import GenerationConfig, Policy
from comlrl_core.remote.client import RemoteModelClient, RemoteModelConfig, RemoteModelError, RemoteRequestError

KEY_ENV = "COMLRL_TEST_LLM_KEY"


@pytest.fixture
def server():
    srv = FakeLLMServer()
    yield srv
    srv.close()


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-policy-test")


def remote_config(server: FakeLLMServer, **overrides) -> RemoteModelConfig:
    options = dict(
        format="openai", model="expert-1", base_url=server.base_url, api_key_env=KEY_ENV, max_retries=0, timeout_s=2.0
    )
    options.update(overrides)
    return RemoteModelConfig(**options)


# -- CallablePolicy --------------------------------------------------------------------------


def test_single_callable_is_called_once_per_sample():
    calls: list[str] = []

    def shout(prompt: str) -> str:
        calls.append(prompt)
        return f"{prompt.upper()}#{len(calls)}"

    policy = CallablePolicy(shout)
    out = policy.generate(["ab", "c"], num_samples=2)
    assert not policy.batched and policy.name == "shout" and policy.trainable is False
    assert [[c.text for c in row] for row in out] == [["AB#1", "AB#2"], ["C#3", "C#4"]]
    assert all(c.token_ids == [] and c.finish_reason == "stop" for row in out for c in row)
    assert calls == ["ab", "ab", "c", "c"]


def test_batched_callable_is_called_once_per_prompt():
    calls: list[tuple[str, int]] = []

    def sample(prompt, k):
        calls.append((prompt, k))
        return [f"{prompt}-{i}" for i in range(k)]

    policy = CallablePolicy(sample, name="sampler")
    out = policy.generate(["x", "y"], num_samples=3)
    assert policy.batched and policy.name == "sampler"
    assert [[c.text for c in row] for row in out] == [["x-0", "x-1", "x-2"], ["y-0", "y-1", "y-2"]]
    assert calls == [("x", 3), ("y", 3)]


class Echo:
    def __call__(self, prompt, num_samples):
        return [prompt] * num_samples


@pytest.mark.parametrize(
    "fn, batched",
    [
        (lambda p: p, False),
        (lambda p, n: [p] * n, True),
        (lambda p, temperature=0.7: p, False),  # optional extras do not make it batched
        (lambda p, *, style="x": p, False),
        (Echo(), True),
        (str.upper, False),
        (functools.partial(lambda tag, p: tag + p, "#"), False),
    ],
)
def test_signature_detection(fn, batched):
    assert CallablePolicy(fn).batched is batched


@pytest.mark.parametrize("fn", [lambda *args: "x", lambda: "x", lambda a, b, c: "x", print])
def test_ambiguous_signature_asks_for_the_flag(fn):
    with pytest.raises(TypeError, match="batched=True"):
        CallablePolicy(fn)


def test_flag_overrides_detection():
    policy = CallablePolicy(lambda *args: [args[0]] * args[1], batched=True)
    assert [c.text for c in policy.generate(["q"], num_samples=2)[0]] == ["q", "q"]


def test_wrong_return_types_are_clear_errors():
    with pytest.raises(TypeError, match="pass batched=True"):
        CallablePolicy(lambda p, n=2: [p] * n).generate(["x"])
    with pytest.raises(TypeError, match="list of 3 strings, got 2 item"):
        CallablePolicy(lambda p, n: [p, p]).generate(["x"], num_samples=3)
    with pytest.raises(TypeError, match="must return str completions, got NoneType"):
        CallablePolicy(lambda p: None).generate(["x"])
    with pytest.raises(TypeError, match="needs a callable"):
        CallablePolicy("not callable")


def test_bad_generate_arguments():
    policy = CallablePolicy(lambda p: p)
    with pytest.raises(TypeError, match="sequence of strings"):
        policy.generate("a prompt")
    with pytest.raises(ValueError, match="num_samples"):
        policy.generate(["a"], num_samples=0)


def test_is_a_non_trainable_policy():
    policy = CallablePolicy(lambda p: p)
    assert isinstance(policy, Policy)
    with pytest.raises(NotImplementedError):
        policy.sequence_logprobs([[1]], [[2]])
    assert list(policy.parameters()) == []


@given(
    prompts=st.lists(st.text(max_size=20), max_size=5),
    num_samples=st.integers(1, 4),
    batched=st.booleans(),
)
@settings(max_examples=60, deadline=None)
def test_output_shape_and_texts(prompts, num_samples, batched):
    if batched:
        policy = CallablePolicy(lambda p, n: [p[::-1]] * n)
    else:
        policy = CallablePolicy(lambda p: p[::-1])
    out = policy.generate(prompts, num_samples=num_samples, generation_config=GenerationConfig(), seed=1)
    assert len(out) == len(prompts)
    for prompt, row in zip(prompts, out, strict=True):
        assert [c.text for c in row] == [prompt[::-1]] * num_samples


# -- RemotePolicy ----------------------------------------------------------------------------


def test_remote_policy_forwards_generation_config(server):
    policy = RemotePolicy(remote_config(server, temperature=1.0))
    try:
        out = policy.generate(
            ["a", "cut"],
            num_samples=2,
            generation_config=GenerationConfig(max_new_tokens=33, temperature=0.2, top_p=0.8),
        )
    finally:
        policy.close()
    assert policy.name == "expert-1" and policy.trainable is False
    assert [[c.text.split("|")[1] for c in row] for row in out] == [["a", "a"], ["cut", "cut"]]
    assert [c.finish_reason for c in out[0]] == ["stop", "stop"]
    assert [c.finish_reason for c in out[1]] == ["length", "length"]  # the server cut "cut"
    assert all(c.token_ids == [] for row in out for c in row)
    for req in server.requests:
        sent = (req.body["n"], req.body["max_tokens"], req.body["temperature"], req.body["top_p"])
        assert sent == (2, 33, 0.2, 0.8)


def test_remote_policy_without_forwarding_uses_client_settings(server):
    with RemoteModelClient(remote_config(server, temperature=0.4, max_tokens=99)) as client:
        policy = RemotePolicy(client, forward_sampling=False, name="expert")
        policy.generate(["a"], generation_config=GenerationConfig(max_new_tokens=5, temperature=1.5))
        policy.close()  # a shared client stays open
        policy.generate(["b"])
    assert [(r.body["max_tokens"], r.body["temperature"]) for r in server.requests] == [(99, 0.4), (99, 0.4)]
    assert policy.name == "expert"


def test_remote_policy_built_from_config_owns_and_closes_its_client(server):
    policy = RemotePolicy(remote_config(server))
    policy.close()
    with pytest.raises(RemoteModelError, match="closed"):
        policy.generate(["a"])


def test_remote_policy_raises_by_default(server):
    server.script(Scripted(status=400, body={"error": {"message": "context too long"}}))
    policy = RemotePolicy(remote_config(server))
    with pytest.raises(RemoteRequestError, match="context too long"):
        policy.generate(["a"])
    policy.close()


def test_remote_policy_can_degrade_to_error_completions(server, caplog):
    # one in-flight request at a time: the scripted failure hits the second prompt
    server.script(Scripted(), Scripted(status=400, body={"error": {"message": "context too long"}}))
    policy = RemotePolicy(remote_config(server, max_concurrency=1), on_error="error_completion")
    out = policy.generate(["a", "b", "c"], num_samples=1)
    policy.close()
    assert [(c.text, c.finish_reason) for c in out[1]] == [("", "error")]
    assert [out[0][0].text, out[2][0].text] == ["1.0|a", "3.0|c"]
    assert "context too long" in caplog.text


def test_remote_policy_argument_errors(server):
    with pytest.raises(TypeError, match="RemoteModelClient or RemoteModelConfig"):
        RemotePolicy({"format": "openai"})
    with pytest.raises(ValueError, match="on_error"):
        RemotePolicy(remote_config(server), on_error="ignore")
