"""The episode engine: per-episode seeding (subset / superset / batch invariance), one
batched generate call per agent per turn, the contract's team reward, and metrics."""

from __future__ import annotations

import pytest
from episode_fakes import DigitEnv, SeededTextPolicy
from hypothesis import given, settings
from hypothesis import strategies as st

from comlrl_core.episodes.engine import play_episodes
from comlrl_core.episodes.evaluation import evaluate_episodes
from comlrl_core.episodes.metrics import episode_metrics
from comlrl_core.policy import GenerationConfig

GEN = GenerationConfig(max_new_tokens=4)


def _play(tasks, n=2, env=None, seed=5, **kw):
    env = env or DigitEnv()
    return play_episodes(
        env,
        tasks,
        [SeededTextPolicy(), SeededTextPolicy()],
        generation_config=GEN,
        seed=seed,
        episodes_per_task=n,
        record=True,
        **kw,
    )


def _by_key(records):
    return {(r.task, r.sample): ([[c.text for c in t.completions] for t in r.turns], r.rewards) for r in records}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=6, unique=True))
def test_a_subset_of_tasks_reproduces_the_full_evaluations_episodes(subset):
    full = _by_key(_play(range(6)))
    part = _by_key(_play(subset))
    assert part == {key: full[key] for key in part}
    assert {t for t, _ in part} == set(subset)


def test_episodes_do_not_depend_on_their_batch_or_on_shared_turn1_prompts():
    together = _by_key(_play(range(4)))
    one_by_one = {}
    for t in range(4):
        one_by_one.update(_by_key(_play([t])))
    assert together == one_by_one
    # distinct reset prompts (no turn-1 fan-out) vs shared prompts: same per-episode seeds
    varied = _play(range(4), env=DigitEnv(vary_prompt=True))
    assert len({r.turns[0].prompts[0] for r in varied if r.task == 0}) == 2
    assert [r.rewards for r in varied] != [] and all(len(r.rewards) == 2 for r in varied)


def test_samples_and_seeds_give_different_draws():
    records = _play(range(3), n=3)
    texts = [r.turns[0].completions[0].text for r in records]
    assert len(set(texts)) == len(texts)  # every (task, sample) draws its own completion
    other = _play(range(3), n=3, seed=6)
    assert [r.turns[0].completions[0].text for r in other] != texts


def test_one_generate_call_per_agent_per_turn_and_clones_closed():
    a, b = SeededTextPolicy(), SeededTextPolicy()
    env = DigitEnv(num_turns=3, num_tasks=5)
    records = play_episodes(env, range(5), [a, b], generation_config=GEN, seed=0, episodes_per_task=2)
    assert a.calls == [(5, 2), (10, 1), (10, 1)] and b.calls == a.calls  # turn 1: shared prompts fan out
    assert len(records) == 10 and all(len(r.rewards) == 3 for r in records)
    assert [r.task for r in records] == [t for t in range(5) for _ in range(2)]


def test_max_turns_caps_episodes():
    records = _play(range(2), env=DigitEnv(num_turns=4), max_turns=2)
    assert all(len(r.rewards) == 2 for r in records)


def test_team_reward_is_the_mean_of_different_agent_rewards():
    records = _play(range(3))
    for r in records:
        for turn, reward in zip(r.turns, r.rewards, strict=True):
            digits = [int(c.text[0]) for c in turn.completions]
            assert reward == pytest.approx(sum(digits) / 9 / 2)
            assert turn.reward == reward
    declared = _play(range(3), env=DigitEnv(team_rule=lambda rewards: min(rewards.values())))
    for r in declared:
        for turn, reward in zip(r.turns, r.rewards, strict=True):
            assert reward == pytest.approx(min(int(c.text[0]) for c in turn.completions) / 9)


def test_metrics_vocabulary_and_values():
    records = _play(range(4), n=2)
    m = episode_metrics(records, discount=0.5, k=(1, 2, 3))
    assert set(m) == {
        "pass@1", "pass@2", "turn_1/reward_mean", "turn_1/num_episodes", "turn_2/reward_mean",
        "turn_2/num_episodes", "return_mean", "num_tasks", "episodes_per_task", "num_episodes",
    }  # fmt: skip
    assert m["return_mean"] == pytest.approx(sum(r.rewards[0] + 0.5 * r.rewards[1] for r in records) / 8)
    assert m["turn_2/reward_mean"] == pytest.approx(sum(r.rewards[1] for r in records) / 8)
    passed = [sum(bool(r.passed) for r in records if r.task == t) for t in range(4)]
    assert m["pass@1"] == pytest.approx(sum(c / 2 for c in passed) / 4)
    assert m["pass@2"] == pytest.approx(sum(c > 0 for c in passed) / 4)
    assert (m["num_tasks"], m["episodes_per_task"], m["num_episodes"]) == (4.0, 2.0, 8.0)


def test_evaluate_episodes_prefixes_and_takes_the_first_tasks():
    result = evaluate_episodes(
        DigitEnv(), [SeededTextPolicy()], num_tasks=3, episodes_per_task=2, seed=5, prefix="eval/"
    )
    assert result.metrics["eval/num_tasks"] == 3 and "eval/return_mean" in result.metrics
    assert [(e.task, e.sample) for e in result.episodes] == [(t, s) for t in range(3) for s in range(2)]


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="episodes_per_task"):
        _play(range(2), n=0)
    with pytest.raises(ValueError, match="2 agents"):
        play_episodes(DigitEnv(), [0], [SeededTextPolicy()], generation_config=GEN, seed=0)
