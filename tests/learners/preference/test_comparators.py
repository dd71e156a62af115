"""Comparators: centralized parsing (drops, never crashes), the API comparator against a
local HTTP server in all four formats, and history checkpoints loaded once per round."""

from __future__ import annotations

import json

import pytest
import torch
from fake_llm_server import FakeLLMServer
from preference_fakes import FakeTeam, TextBigram, a_fraction, env_factory

from comlrl_core.config.options import ConfigError
from comlrl_core.models.simple_policies import CallablePolicy, RemotePolicy
from comlrl_core.policy import GenerationConfig
from comlrl_core.remote.config import RemoteModelConfig
from learners.madpo import MADPOIterConfig, MADPOIterTrainer
from learners.preference.candidates import TaskCandidates
from learners.preference.comparators import (
    Comparator,
    centralized_prompt,
    parse_centralized,
)


def test_parse_centralized():
    assert parse_centralized("<agent_0> hi </agent_0>\n<AGENT_1>yo</agent_1>", 2) == (["hi", "yo"], 0)
    # CoMLRL's rule: a missing role section reads as an empty response ...
    assert parse_centralized("<agent_0>only one</agent_0>", 2) == (["only one", ""], 1)
    assert parse_centralized("<agent_1>second</agent_1>", 3) == (["", "second", ""], 2)
    # ... and only a response without any section is unreadable
    assert parse_centralized("", 1) == (None, 1)
    assert parse_centralized("no tags here", 2) == (None, 2)
    assert "<agent_1>" in centralized_prompt(["p0", "p1"], ["a", "b"])


def test_centralized_comparator_fills_missing_sections_and_drops_only_sectionless():
    replies = iter(
        [
            "<agent_0>x</agent_0><agent_1>y</agent_1>",
            "garbage",
            "<agent_0>z</agent_0>",
            "<agent_1>b</agent_1><agent_0>a</agent_0>",
        ]
        * 2
    )
    seen = []

    def writer(prompt):
        seen.append(prompt)
        return next(replies)

    comp = Comparator([CallablePolicy(lambda p: "unused"), CallablePolicy(writer)], ["a0", "a1"], centralized_index=1)
    tasks = [
        TaskCandidates(task=0, env=None, prompts=["p0", "p1"]),
        TaskCandidates(task=1, env=None, prompts=["q0", "q1"]),
    ]
    dropped = comp.sample(tasks, 4, GenerationConfig(), [0, 1])
    assert dropped == 2  # "garbage", once per task
    assert comp.last_partial == 2  # "<agent_0>z</agent_0>", once per task: kept, agent_1 empty
    assert [None if c is None else c.completions for c in tasks[0].candidates] == [
        ["x", "y"],
        None,
        ["z", ""],
        ["a", "b"],
    ]
    assert all("p0" in s and "p1" in s for s in seen[:4])


def _iter_config(tmp_path, **kw):
    base = dict(
        num_iterations=2,
        preference_num_candidates=3,
        preference_pairs_per_sample=2,
        max_new_tokens=3,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        num_train_epochs=1,
        train_batch_size=2,
        eval_interval=0,
        agent_learning_rate=0.1,
        output_dir=str(tmp_path / "run"),
        progress_bar=False,
        seed=2,
    )
    base.update(kw)
    return MADPOIterConfig(**base)


@pytest.mark.parametrize("fmt", ["generic", "openai", "anthropic", "openai_responses"])
def test_api_comparator_in_every_format(tmp_path, fmt, monkeypatch):
    monkeypatch.setenv("FAKE_KEY", "sk-test")
    server = FakeLLMServer()
    try:
        # the full endpoint URLs, as CoMLRL documents comparator_api_url
        paths = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages", "openai_responses": "/v1/responses"}
        url = server.url + paths.get(fmt, "/generate")
        # the comparator's answers contain many 'a's: it wins the comparisons on a_fraction
        cfg = _iter_config(
            tmp_path,
            comparator_policy="api",
            comparator_api_format=fmt,
            comparator_api_url=url,
            comparator_api_model="m",
            comparator_api_key_env="FAKE_KEY",
            comparator_api_response_field="outputs",
            num_iterations=1,
        )
        trainer = MADPOIterTrainer(
            cfg, FakeTeam([TextBigram(init_seed=1), TextBigram(init_seed=2)]), env_factory(a_fraction)
        )
        trainer.train()
    finally:
        server.close()
    assert server.requests, "the comparator never called the server"
    sent = " ".join(json.dumps(r.body) for r in server.requests)
    assert all(f"task{t} turn1 a{i}" in sent for t in range(3) for i in range(2))  # every agent's own prompt
    payload = json.loads((tmp_path / "run" / "preference_replay" / "iteration_0001.json").read_text())
    assert payload["num_pairs"] > 0
    texts = [c for p in payload["pairs"] for c in p["winner_completions"] + p["loser_completions"]]
    assert any("|task" in t for t in texts)  # the server's answers took part
    for p in payload["pairs"]:
        assert p["winner_reward"] > p["loser_reward"]
        assert p["raw_rewards"] == [p["winner_reward"], p["loser_reward"]]
        assert {p["target_raw_reward"], p["comparator_raw_reward"]} == set(p["raw_rewards"])


def test_api_comparator_tells_generic_endpoints_the_agent_and_task():
    class TaskEnv:
        def task(self, index):
            return {"task_id": f"T{index}", "tests": ("assert f() == 1",)}

    server = FakeLLMServer()
    try:
        config = RemoteModelConfig(
            format="generic", model="m", base_url=server.generic_url, api_key_env="", response_field="outputs"
        )
        policy = RemotePolicy(config)
        comp = Comparator([policy, policy], ["a0", "a1"], kind="api")
        tasks = [TaskCandidates(task=k, env=TaskEnv(), prompts=[f"t{k}a0", f"t{k}a1"]) for k in range(2)]
        assert comp.sample(tasks, 2, GenerationConfig(max_new_tokens=5), [0, 1]) == 0
        comp.close()
    finally:
        server.close()
    assert len(server.requests) == 4  # one per (agent, task), each asking for both candidates
    for req in server.requests:
        k, i = int(req.body["prompt"][1]), int(req.body["prompt"][-1])
        assert req.body["agent_idx"] == i and req.body["num_return_sequences"] == 2
        assert req.body["batch_item"] == {"task_id": f"T{k}", "tests": ["assert f() == 1"]}
        assert req.body["max_new_tokens"] == 5
    for k, task in enumerate(tasks):
        assert [[t.split("|")[1] for t in c.completions] for c in task.candidates] == [[f"t{k}a0", f"t{k}a1"]] * 2
        assert task.prompt_ids is None and all(c.token_ids is None for c in task.candidates)


@pytest.mark.parametrize("alias", ["responses", "codex", "openai_responses"])
def test_comparator_api_format_accepts_comlrls_aliases(tmp_path, alias):
    cfg = _iter_config(
        tmp_path,
        comparator_policy="api",
        comparator_api_format=alias,
        comparator_api_url="https://api.openai.com/v1/responses",
        comparator_api_model="m",
    )
    assert cfg.comparator_api_format == "openai_responses"


def test_comparator_api_format_unknown_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="comparator_api_format"):
        _iter_config(
            tmp_path,
            comparator_policy="api",
            comparator_api_format="gopher",
            comparator_api_url="http://h/x",
            comparator_api_model="m",
        )


def test_history_comparator_loads_once_per_round(tmp_path):
    cfg = _iter_config(tmp_path, comparator_policy="history", comparator_history_k=1, num_iterations=3)
    trainer = MADPOIterTrainer(
        cfg, FakeTeam([TextBigram(init_seed=1), TextBigram(init_seed=2)]), env_factory(a_fraction, 4)
    )
    loads = []
    real = trainer.history_checkpoint
    trainer.history_checkpoint = lambda r: loads.append(r) or real(r)
    trainer.train()
    assert loads == [1, 2, 3]  # once per round, not per task
    assert trainer.comparator_loads == 3
    logged = [h["iter/comparator_loads"] for h in trainer.history if "iter/comparator_loads" in h]
    assert logged == [1.0, 2.0, 3.0]  # the running count, in each round's metrics
    ckpts = sorted(p.name for p in (tmp_path / "run" / "policy_checkpoints").iterdir())
    assert ckpts == ["iteration_0000", "iteration_0001", "iteration_0002", "iteration_0003"]
    assert real(1).name == "iteration_0000" and real(3).name == "iteration_0002"
    # the comparator of the last round held the weights saved after round 2
    saved = torch.load(
        tmp_path / "run" / "policy_checkpoints" / "iteration_0002" / "policies" / "agent_0" / "logits.pt"
    )
    assert torch.equal(trainer._history_copies[0].logits, saved)
    assert not trainer._history_copies[0].logits.requires_grad


def test_current_comparator_uses_a_separate_stream_and_may_lose(tmp_path):
    cfg = _iter_config(tmp_path, pair_selection="all", preference_pairs_per_sample=None, num_iterations=1)
    trainer = MADPOIterTrainer(
        cfg, FakeTeam([TextBigram(init_seed=1), TextBigram(init_seed=2)]), env_factory(a_fraction, 4)
    )
    trainer.train()
    payload = json.loads((tmp_path / "run" / "preference_replay" / "iteration_0001.json").read_text())
    sides = {p["target_raw_reward"] == p["winner_reward"] for p in payload["pairs"]}
    assert payload["num_pairs"] > 0 and sides == {True, False}  # either side wins sometimes


@pytest.mark.parametrize(
    "kw,option",
    [
        (dict(comparator_policy="model"), "comparator_model_name"),
        (dict(comparator_policy="api"), "comparator_api_url"),
        (dict(comparator_history_k=2), "comparator_history_k"),
        (dict(comparator_model_name="x"), "comparator_model_name"),
        (dict(preference_replay_mode="current", preference_replay_sample_size=3), "preference_replay_sample_size"),
        (dict(num_turns=2), "num_turns"),
    ],
)
def test_iterative_config_errors(tmp_path, kw, option):
    with pytest.raises(ConfigError, match=option):
        _iter_config(tmp_path, **kw)
