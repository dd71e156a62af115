"""The generic format's request body (CoMLRL's), and what a request is for (agent, task)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from remote_helpers import make_client

from comlrl_core.remote.client import json_ready


def test_generic_body_is_comlrls(server):
    with make_client(server, "generic", temperature=0.7, top_p=0.9, max_tokens=64) as client:
        texts = client.complete("fix me", n=3, agent_index=1, task_item={"task_id": "HumanEval/0", "entry": "f"})
    assert texts == ["1.0|fix me", "1.1|fix me", "1.2|fix me"]
    assert server.requests[0].body == {
        "prompt": "fix me",
        "agent_idx": 1,
        "num_return_sequences": 3,
        "max_new_tokens": 64,
        "temperature": 0.7,
        "top_p": 0.9,
        "batch_item": {"task_id": "HumanEval/0", "entry": "f"},
        "model": "test-model",
    }


def test_generic_body_without_context_sends_nulls(server):
    with make_client(server, "generic") as client:
        client.complete("x")
    body = server.requests[0].body
    assert body["agent_idx"] is None and body["batch_item"] is None and body["num_return_sequences"] == 1
    assert "temperature" not in body and "top_p" not in body  # None: the server's default


def test_batch_sends_each_prompt_its_own_task_item(server):
    with make_client(server, "generic", max_concurrency=1) as client:
        rows = client.complete_batch(["a", "b"], n=1, agent_index=0, task_items=[{"id": 1}, {"id": 2}])
    assert [row[0].split("|")[1] for row in rows] == ["a", "b"]
    sent = {r.body["prompt"]: (r.body["agent_idx"], r.body["batch_item"]) for r in server.requests}
    assert sent == {"a": (0, {"id": 1}), "b": (0, {"id": 2})}


def test_template_placeholders_for_agent_and_task(server):
    template = {"agent_idx": None, "meta": {"agent": "{agent_idx}", "item": "{batch_item}"}}
    with make_client(server, "generic", request_template=template) as client:
        client.complete("x", agent_index=2, task_item=[1, 2])
    body = server.requests[0].body
    assert "agent_idx" not in body and body["meta"] == {"agent": 2, "item": [1, 2]}


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_sdk_formats_accept_and_do_not_send_the_context(server, fmt):
    with make_client(server, fmt) as client:
        assert client.complete("x", agent_index=0, task_item={"id": 1}) == ["1.0|x"]
    assert "batch_item" not in server.requests[0].body and "agent_idx" not in server.requests[0].body


def test_context_arguments_are_checked(server):
    with make_client(server, "generic") as client:
        with pytest.raises(ValueError, match="one task item per prompt"):
            client.complete_batch(["a", "b"], task_items=[{}])
        with pytest.raises(TypeError, match="agent_index"):
            client.complete("a", agent_index="0")
    assert server.requests == []


def test_json_ready_makes_task_items_serialisable():
    item = {"ids": np.arange(3), "score": np.float32(0.5), 3: ("a", {1, 2}), "obj": object}
    out = json_ready(item)
    assert out["ids"] == [0, 1, 2] and out["score"] == 0.5 and out["3"][0] == "a"
    assert sorted(out["3"][1]) == [1, 2] and out["obj"] == str(object)


def test_importing_the_client_loads_no_http_stack():
    code = (
        "import sys, comlrl_core.remote.client; "
        "print(sorted(m for m in ('httpx2', 'httpcore2', 'openai', 'anthropic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
