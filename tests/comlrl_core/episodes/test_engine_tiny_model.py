"""The engine with a real transformers policy (the tiny random model): per-completion
seeds make each episode independent of the tasks and batches evaluated with it."""

from __future__ import annotations

import pytest
from episode_fakes import DigitEnv

from comlrl_core.episodes.engine import play_episodes
from comlrl_core.policy import GenerationConfig

GEN = GenerationConfig(max_new_tokens=6, temperature=1.0, top_p=0.95, top_k=0)


def _texts(policy, tasks, n=2, seed=11):
    records = play_episodes(
        DigitEnv(num_turns=2, num_tasks=6, vary_prompt=True),
        tasks,
        [policy, policy],
        generation_config=GEN,
        seed=seed,
        episodes_per_task=n,
        record=True,
    )
    return {(r.task, r.sample): [[c.token_ids for c in t.completions] for t in r.turns] for r in records}


def test_subset_and_single_episodes_match_the_full_evaluation(tiny_policy):
    full = _texts(tiny_policy, range(6))
    subset = _texts(tiny_policy, [4, 1])
    assert subset == {key: full[key] for key in subset}
    alone = _texts(tiny_policy, [3], n=2)
    assert alone == {key: full[key] for key in alone}
    # the draws are real: different samples of one task differ
    assert full[(0, 0)] != full[(0, 1)]


def test_per_completion_seeds_are_batch_independent(tiny_policy):
    prompts = ["alpha beta", "a much longer prompt that pads the others", "gamma"]
    seeds = [7, 8, 9, 10, 11, 12]
    together = tiny_policy.generate(prompts, 2, GEN, seeds)
    for p, prompt in enumerate(prompts):
        alone = tiny_policy.generate([prompt], 2, GEN, seeds[2 * p : 2 * p + 2])
        assert [c.token_ids for c in alone[0]] == [c.token_ids for c in together[p]]
    # an int seed keeps its meaning: one stream for the whole call, reproducible
    a = tiny_policy.generate(prompts, 2, GEN, 3)
    b = tiny_policy.generate(prompts, 2, GEN, 3)
    assert [[c.token_ids for c in row] for row in a] == [[c.token_ids for c in row] for row in b]


def test_wrong_number_of_seeds_is_refused(tiny_policy):
    with pytest.raises(ValueError, match="one seed per completion"):
        tiny_policy.generate(["x", "y"], 2, GEN, [1, 2, 3])
