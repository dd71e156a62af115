"""Agents with DIFFERENT rewards: the MAGRPO tree, actor-critic rollouts, preference
candidates and the evaluation all read the same team reward (the contract's mean)."""

from __future__ import annotations

import pytest
from episode_fakes import DigitEnv, SeededTextPolicy, digit

from comlrl_core.episodes.evaluation import evaluate_episodes
from comlrl_core.policy import GenerationConfig
from learners.common.episodes import collect_episodes
from learners.magrpo.tree import build_tree
from learners.preference.candidates import TaskRewardOracle, reset_tasks, sample_candidates, score_tasks

GEN = GenerationConfig(max_new_tokens=4)


def _expected(texts):
    return sum(digit(t) for t in texts) / 9 / len(texts)


def test_every_reader_sees_the_mean_of_the_agents_rewards():
    policies = [SeededTextPolicy(), SeededTextPolicy()]
    env = DigitEnv(num_turns=1, num_tasks=3)
    names = list(env.possible_agents)

    result = evaluate_episodes(env, policies, num_tasks=3, episodes_per_task=2, generation_config=GEN, seed=1)
    episodes = collect_episodes(
        env, [0, 1, 2], policies, names, num_turns=1, num_generations=2, generation_config=GEN, seed=1
    )
    # the rollouts are the evaluation's episodes: same seeds, same engine, same team reward
    assert [e.rewards for e in episodes] == [e.rewards for e in result.episodes]
    for ep in episodes:
        assert ep.turns[0].reward == pytest.approx(_expected([a.completion for a in ep.turns[0].agents]))
    assert result.metrics["turn_1/reward_mean"] == pytest.approx(sum(e.rewards[0] for e in episodes) / 6)

    obs, _ = env.reset(seed=0, options={"task": 0})
    tree = build_tree(
        env, [obs[a] for a in names], policies, names, num_generations=2, num_turns=1, joint_mode="cross",
        generation_config=GEN, seed=3,
    )  # fmt: skip
    for joint in tree.leaves():
        texts = [tree.root.completions[i][g].text for i, g in enumerate(joint.indices)]
        assert joint.reward == pytest.approx(_expected(texts))

    tasks = reset_tasks(env, [0, 1], names, [0, 0])
    sample_candidates(tasks, policies, 2, GEN, [5, 6])
    score_tasks(TaskRewardOracle(names), tasks)
    for task in tasks:
        for cand in task.candidates:
            assert cand.reward == pytest.approx(_expected(cand.completions))
