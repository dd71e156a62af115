"""envs.evaluate: the pass@k estimator, teams of callables/policies, and `comlrl eval`."""

from __future__ import annotations

import itertools
import json
from math import comb

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envs
from comlrl_core.policy import Completion, Policy
from envs.evaluate import as_policies, pass_at_k
from envs.writing import WritingRewardConfig, score_writing
from envs.writing.passages import load_passages


# ---- estimator -------------------------------------------------------------------------------
def _brute_force(n: int, c: int, k: int) -> float:
    """Fraction of the k-subsets of n samples (c passing) holding at least one pass."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 11).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_enumeration(nck):
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(_brute_force(n, c, k), abs=1e-12)


def test_pass_at_k_known_values():
    assert pass_at_k(10, 0, 1) == 0.0 and pass_at_k(10, 10, 5) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 1, 2) == pytest.approx(0.4)
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    assert pass_at_k(10, 8, 3) == 1.0  # n - c < k
    # large n stays exact where the binomials are astronomically large
    assert pass_at_k(1000, 7, 100) == pytest.approx(1 - comb(993, 100) / comb(1000, 100), rel=1e-9)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


# ---- evaluate with known teams ------------------------------------------------------------
def _alternating(good_every: int):
    calls = itertools.count()
    return lambda prompt: "good" if "Revise" in prompt or next(calls) % good_every == 0 else "bad"


def test_callable_team_gives_known_pass_at_k_and_turn_rewards(toy_cls):
    # agent a always right; agent b right on every 2nd sample at turn 1 and always when revising
    result = envs.evaluate(
        toy_cls,
        [lambda p: "good", _alternating(2)],
        n_samples=4,
        k=(1, 2, 8),
        env_kwargs={"num_turns": 2, "early_termination_threshold": 1.0, "num_tasks": 3},
    )
    m = result.metrics
    assert "pass@8" not in m and m["pass@1"] == 1.0 and m["pass@2"] == 1.0
    assert m["turn_1/reward_mean"] == pytest.approx(0.75) and m["turn_1/num_episodes"] == 12
    assert m["turn_2/reward_mean"] == 1.0 and m["turn_2/num_episodes"] == 6
    assert [t.num_passed for t in result.per_task] == [4, 4, 4]

    single = envs.evaluate(
        toy_cls, {"a": lambda p: "good", "b": _alternating(2)}, n_samples=4, k=(1, 2), env_kwargs={"num_tasks": 3}
    )
    assert single["pass@1"] == pytest.approx(0.5) and single["pass@2"] == pytest.approx(5 / 6)
    assert "turn_2/reward_mean" not in single.metrics


def test_num_tasks_limits_the_tasks(toy_cls):
    result = envs.evaluate(toy_cls, [lambda p: "good"], n_samples=1, k=1, num_tasks=2)
    assert len(result.per_task) == 2 and result["pass@1"] == 1.0


def test_writing_team_rewards_equal_the_reward_function():
    def summarizer(prompt):
        return prompt.split("\n")[1][:60]

    def expander(prompt):
        return prompt.split("\n")[1] + " This is why it matters to everyone nearby."

    result = envs.evaluate("comlrl/Writing-v0", [summarizer, expander], n_samples=2, k=(1,), num_tasks=5)
    passages = [item["passage"] for item in load_passages()[:5]]
    expected = [
        score_writing(p, p[:60], p + " This is why it matters to everyone nearby.", WritingRewardConfig())[0]
        for p in passages
    ]
    assert result["turn_1/reward_mean"] == pytest.approx(sum(expected) / 5)
    assert [t.final_rewards for t in result.per_task] == [pytest.approx([e, e]) for e in expected]
    assert result["pass@1"] == pytest.approx(sum(e >= 2.4 for e in expected) / 5)


class RecordingPolicy(Policy):
    """Counts generate calls; answers by sample index so samples differ."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def generate(self, prompts, num_samples=1, generation_config=None, seed=None):
        self.calls.append((len(prompts), num_samples, seed))
        return [[Completion(self.answers[s % len(self.answers)]) for s in range(num_samples)] for _ in prompts]


def test_one_generate_call_per_agent_per_turn(toy_cls):
    a, b = RecordingPolicy(["good"]), RecordingPolicy(["bad", "good"])
    result = envs.evaluate(
        toy_cls,
        [a, b],
        n_samples=2,
        k=1,
        seed=3,
        env_kwargs={"num_turns": 3, "num_tasks": 5, "early_termination_threshold": 1.0},
    )
    # turn 1: 5 prompts x 2 samples; then only the failing half goes on, one sample each
    assert [c[:2] for c in a.calls] == [(5, 2), (5, 1), (5, 1)]
    assert [c[:2] for c in b.calls] == [(5, 2), (5, 1), (5, 1)]
    # one seed per completion, distinct across episodes, turns and agents
    assert [len(c[2]) for c in a.calls] == [10, 5, 5]
    assert len({seed for c in a.calls + b.calls for seed in c[2]}) == 40
    assert result["pass@1"] == 0.5 and result["turn_3/num_episodes"] == 5


def test_team_shapes(toy_cls):
    pol = RecordingPolicy(["x"])
    assert as_policies([pol], ["a", "b"]) == {"a": pol, "b": pol}
    assert as_policies(pol, ["a", "b"]) == {"a": pol, "b": pol}
    mapped = as_policies({"a": lambda p: "1", "b": pol}, ["a", "b"])
    assert mapped["b"] is pol and mapped["a"].generate(["q"])[0][0].text == "1"
    with pytest.raises(ValueError, match="3 members"):
        as_policies([pol, pol, pol], ["a", "b"])
    with pytest.raises(ValueError, match="lacks agents"):
        as_policies({"a": pol}, ["a", "b"])
    with pytest.raises(TypeError, match="neither a Policy"):
        as_policies([1, 2], ["a", "b"])


def test_bad_arguments(toy_cls):
    with pytest.raises(ValueError, match="n_samples"):
        envs.evaluate(toy_cls, [lambda p: "good"], n_samples=0)
    with pytest.raises(ValueError, match="k values"):
        envs.evaluate(toy_cls, [lambda p: "good"], k=(0,))

    class Broken(RecordingPolicy):
        def generate(self, prompts, num_samples=1, generation_config=None, seed=None):
            return [[Completion("good")]]

    with pytest.raises(ValueError, match="returned 1 rows for 6 prompts"):
        envs.evaluate(toy_cls, [Broken([])], n_samples=2)


# ---- command line ---------------------------------------------------------------------------
def test_parse_env_kwargs():
    from envs.cli import parse_env_kwargs

    assert parse_env_kwargs(["num_turns=2", "task_slice=0:10", "x=true", "y=0.5", "mode=plain"]) == {
        "num_turns": 2,
        "task_slice": "0:10",
        "x": True,
        "y": 0.5,
        "mode": "plain",
    }
    with pytest.raises(ValueError, match="key=value"):
        parse_env_kwargs(["novalue"])


def test_comlrl_eval_end_to_end_with_tiny_random(tmp_path, capsys):
    from comlrl_core.cli import main

    out = tmp_path / "results.json"
    code = main(
        [
            "eval",
            "--env",
            "comlrl/Writing-v0",
            "--model",
            "tiny-random",
            "--n-samples",
            "2",
            "--k",
            "1",
            "2",
            "4",
            "--num-tasks",
            "2",
            "--env-kwarg",
            "num_turns=2",
            "--max-new-tokens",
            "8",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "| eval/pass@1 |" in printed and "| eval/turn_2/reward_mean |" in printed and "pass@4" not in printed
    data = json.loads(out.read_text())  # flat, with the eval/ keys trainers log
    assert data["eval/num_tasks"] == 2.0 and data["eval/episodes_per_task"] == 2.0
    assert data["eval/turn_1/num_episodes"] == 4.0
    assert 0.0 <= data["eval/turn_2/reward_mean"] <= 3.0
    assert set(data) == {k for k in data if k.startswith("eval/")}


def test_comlrl_eval_task_slice_selects_the_split(capsys):
    from comlrl_core.cli import main

    args = ["eval", "--env", "comlrl/Writing-v0", "--model", "tiny-random", "--max-new-tokens", "4"]
    assert main([*args, "--task-slice=-3:", "--env-kwarg", "num_turns=1"]) == 0
    assert "| eval/num_tasks | 3 |" in capsys.readouterr().out


def test_comlrl_eval_rejects_wrong_model_count(capsys):
    from comlrl_core.cli import main

    code = main(["eval", "--env", "comlrl/Writing-v0", "--model", "a", "--model", "b", "--model", "c"])
    assert code == 2 and "--model once" in capsys.readouterr().err
