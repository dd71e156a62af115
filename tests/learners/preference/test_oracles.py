"""The pluggable preference oracle (``oracle=`` on every preference trainer) and the LLM-judge
oracle against the local test server."""

from __future__ import annotations

import json

import pytest
from fake_llm_server import FakeLLMServer, Scripted
from preference_fakes import FakeTeam, TextBigram, a_fraction, env_factory

from comlrl_core.remote.client import RemoteModelConfig
from learners.madpo import MADPOConfig, MADPOIterConfig, MADPOIterTrainer, MADPOTrainer
from learners.marlhf import MARLHFConfig, MARLHFIterConfig, MARLHFIterTrainer, MARLHFTrainer
from learners.preference.candidates import JointCandidate, TaskCandidates
from learners.preference.oracles import (
    CallableOracle,
    JudgeParseError,
    LLMJudgeOracle,
    OracleError,
    parse_score,
)

COMMON = dict(
    preference_num_candidates=4,
    preference_pairs_per_sample=2,
    max_new_tokens=3,
    temperature=1.0,
    top_p=1.0,
    top_k=None,
    eval_interval=0,
    agent_learning_rate=0.1,
    progress_bar=False,
    seed=1,
)


def b_count(prompts: list[str], joint_responses: list[list[str]]) -> list[float]:
    """A rule oracle that disagrees with the env's reward (a_fraction): more 'b' is better."""
    assert all(p.startswith("task") for p in prompts)
    return [float("".join(joint).count("b")) for joint in joint_responses]


def _team():
    return FakeTeam([TextBigram(init_seed=1), TextBigram(init_seed=2)])


def test_madpo_pairs_follow_the_oracle_not_the_env_reward(tmp_path):
    calls = []

    def oracle(prompts, joint_responses):
        calls.append(len(joint_responses))
        return b_count(prompts, joint_responses)

    cfg = MADPOConfig(**COMMON, num_train_epochs=1, train_batch_size=2, output_dir=str(tmp_path / "run"))
    trainer = MADPOTrainer(cfg, _team(), env_factory(a_fraction), oracle=oracle)
    pairs, _ = trainer.collect_pairs()
    assert pairs and calls == [4, 4, 4]  # one call per task, over its 4 joint responses
    for p in pairs:
        winner, loser = "".join(p.winner_completions).count("b"), "".join(p.loser_completions).count("b")
        assert winner > loser and p.winner_reward == winner and p.loser_reward == loser


@pytest.mark.parametrize(
    "config_cls,trainer_cls,extra",
    [
        (MADPOIterConfig, MADPOIterTrainer, dict(num_iterations=1)),
        (MARLHFConfig, MARLHFTrainer, dict(reward_model_name="tiny-random", reward_model_device="cpu")),
        (MARLHFIterConfig, MARLHFIterTrainer, dict(reward_model_name="tiny-random", reward_model_device="cpu")),
    ],
)
def test_every_preference_trainer_takes_an_oracle(tmp_path, config_cls, trainer_cls, extra):
    cfg = config_cls(**COMMON, **extra, output_dir=str(tmp_path / "run"))
    trainer = trainer_cls(cfg, _team(), env_factory(a_fraction), oracle=b_count)
    assert isinstance(trainer.oracle, CallableOracle) and trainer.oracle.fn is b_count
    if hasattr(trainer, "preference_oracle"):  # the iterative rounds score both sides with it
        assert trainer.preference_oracle() is trainer.oracle


def test_iterative_round_scores_both_sides_with_the_oracle(tmp_path):
    cfg = MADPOIterConfig(
        **{**COMMON, "pair_selection": "all", "preference_pairs_per_sample": None},
        num_iterations=1,
        output_dir=str(tmp_path / "run"),
    )
    trainer = MADPOIterTrainer(cfg, _team(), env_factory(a_fraction), oracle=b_count)
    trainer.train()
    payload = json.loads((tmp_path / "run" / "preference_replay" / "iteration_0001.json").read_text())
    assert payload["num_pairs"] > 0
    for p in payload["pairs"]:
        assert p["winner_reward"] == "".join(p["winner_completions"]).count("b")
        assert p["loser_reward"] == "".join(p["loser_completions"]).count("b")
    assert any("iter/comparator_partial" in h for h in trainer.history)


def _requests(n: int) -> list[tuple[TaskCandidates, JointCandidate]]:
    task = TaskCandidates(task=7, env=None, prompts=["p0", "p1"])
    return [(task, JointCandidate(completions=[f"x{k}", "y"])) for k in range(n)]


@pytest.mark.parametrize(
    "bad,match",
    [
        (lambda p, j: [1.0], "one score per joint response"),
        (lambda p, j: [float("nan")] * len(j), "finite"),
        (lambda p, j: ["high"] * len(j), "numbers"),
    ],
)
def test_a_bad_oracle_answer_is_a_clear_error(bad, match):
    with pytest.raises(OracleError, match=match):
        CallableOracle(bad).score(_requests(2))


def test_parse_score():
    assert parse_score("fine work.\nScore: 7", 0, 10) == 7.0
    assert parse_score("<score>8.5</score>", 0, 10) == 8.5
    assert parse_score("score = 2, no wait, Score: 4", 0, 10) == 4.0
    assert parse_score("Score: 11", 0, 10) is None  # out of range
    assert parse_score("I like it", 0, 10) is None


def _chat(text: str) -> Scripted:
    return Scripted(
        body={
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "judge",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        }
    )


@pytest.fixture
def server():
    srv = FakeLLMServer()
    yield srv
    srv.close()


def _judge(server: FakeLLMServer, **kw) -> LLMJudgeOracle:
    config = RemoteModelConfig(
        format="openai",
        model="judge",
        base_url=server.url + "/v1/chat/completions",
        api_key_env="",
        max_retries=0,
        max_concurrency=1,  # the scripted replies are consumed in request order
        timeout_s=5.0,
    )
    return LLMJudgeOracle(config, agent_names=["aux", "main"], **kw)


def test_llm_judge_scores_every_joint_response_and_retries_unparsable_replies(server):
    server.script(_chat("Solid. Score: 7"), _chat("hmm, hard to say"), _chat("<score>3</score>"))
    judge = _judge(server, rubric="RUBRIC-XYZ")
    try:
        scores = judge(["write f", "write g"], [["def f(): 1", "def g(): 2"], ["pass", "pass"]])
    finally:
        judge.close()
    assert scores == [7.0, 3.0]
    assert len(server.requests) == 3  # the second joint response was asked again
    first = server.requests[0].body["messages"][-1]["content"]
    assert "RUBRIC-XYZ" in first and "<agent_0>" in first and "Role: main" in first
    assert "def g(): 2" in first and "write f" in first
    assert server.requests[2].body["messages"][-1]["content"] == server.requests[1].body["messages"][-1]["content"]


def test_llm_judge_gives_up_with_a_clear_error(server):
    server.script(*[_chat("no number here") for _ in range(3)])
    judge = _judge(server, parse_retries=2)
    try:
        with pytest.raises(JudgeParseError, match="no readable score.*no number here"):
            judge(["p0", "p1"], [["a", "b"]])
    finally:
        judge.close()
    assert len(server.requests) == 3


def test_llm_judge_as_a_trainer_oracle(server, tmp_path):
    server.script(*[_chat(f"Score: {k % 5}") for k in range(12)])
    judge = _judge(server)
    cfg = MADPOConfig(**COMMON, num_train_epochs=1, train_batch_size=2, output_dir=str(tmp_path / "run"))
    trainer = MADPOTrainer(cfg, _team(), env_factory(a_fraction), oracle=judge)
    try:
        pairs, _ = trainer.collect_pairs()
    finally:
        judge.close()
    assert len(server.requests) == 12  # 3 tasks x 4 joint responses
    assert pairs and all(p.winner_reward > p.loser_reward for p in pairs)
    assert {p.winner_reward for p in pairs} <= {0.0, 1.0, 2.0, 3.0, 4.0}
