"""Pair selection: invariants (hypothesis) and the documented orders."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learners.preference.pairs import select_comparisons, select_pairs

rewards_st = st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, -1.0]) | st.floats(-5, 5), min_size=0, max_size=8)
limit_st = st.none() | st.integers(1, 10)


@settings(max_examples=200, deadline=None)
@given(
    rewards=rewards_st, mode=st.sampled_from(["reward_gap", "random", "all"]), limit=limit_st, seed=st.integers(0, 99)
)
def test_pairs_are_untied_winner_better_and_limited(rewards, mode, limit, seed):
    if mode == "all":
        limit = None
    pairs = select_pairs(rewards, mode, limit, random.Random(seed))
    eligible = {(w, lose) for w in range(len(rewards)) for lose in range(len(rewards)) if rewards[w] > rewards[lose]}
    assert len(set(pairs)) == len(pairs)
    assert set(pairs) <= eligible
    assert all(rewards[w] > rewards[lose] for w, lose in pairs)  # ties never
    expected = len(eligible) if limit is None else min(limit, len(eligible))
    assert len(pairs) == expected
    if mode == "all":
        assert pairs == sorted(eligible)
    if mode == "reward_gap" and pairs:
        kept = min(rewards[w] - rewards[lose] for w, lose in pairs)
        dropped = [rewards[w] - rewards[lose] for w, lose in eligible - set(pairs)]
        assert all(g <= kept for g in dropped)  # the largest gaps are the ones kept


def test_all_ties_yield_nothing():
    assert select_pairs([1.0, 1.0, 1.0], "all") == []
    assert select_pairs([0.3], "reward_gap", 4) == []


def test_reward_gap_order_is_exact():
    assert select_pairs([0.0, 1.0, 0.5], "reward_gap", 2) == [(1, 0), (1, 2)]
    assert select_pairs([0.0, 1.0, 0.5], "all") == [(1, 0), (1, 2), (2, 0)]


def test_random_is_seeded():
    r = [0.0, 1.0, 2.0, 3.0, 4.0]
    a = select_pairs(r, "random", 3, random.Random(5))
    assert a == select_pairs(r, "random", 3, random.Random(5))


def test_bad_options_raise():
    with pytest.raises(ValueError, match="preference_pairs_per_sample=None"):
        select_pairs([0.0, 1.0], "all", 2)
    with pytest.raises(ValueError, match="pair_selection"):
        select_pairs([0.0, 1.0], "comparator_reward", 2)


opt_rewards = st.lists(st.none() | st.sampled_from([0.0, 0.5, 1.0]) | st.floats(-3, 3), max_size=7)


@settings(max_examples=200, deadline=None)
@given(
    target=opt_rewards,
    comp=opt_rewards,
    limit=limit_st,
    mode=st.sampled_from(["reward_gap", "random", "all", "comparator_reward"]),
    seed=st.integers(0, 50),
)
def test_comparisons_use_the_same_index_and_either_side_wins(target, comp, limit, mode, seed):
    if mode == "all":
        limit = None
    found = select_comparisons(target, comp, mode, limit, random.Random(seed))
    n = min(len(target), len(comp))
    eligible = [i for i in range(n) if target[i] is not None and comp[i] is not None and target[i] != comp[i]]
    assert len(found) == (len(eligible) if limit is None else min(limit, len(eligible)))
    for c in found:
        assert c.index in eligible  # same index only, dropped / tied never
        assert c.target_reward == target[c.index] and c.comparator_reward == comp[c.index]
        assert c.target_wins == (target[c.index] > comp[c.index])
    if mode == "comparator_reward":
        keys = [(-c.comparator_reward, -c.gap) for c in found]
        assert keys == sorted(keys)


def test_comparator_may_win_and_lengths_may_differ():
    found = select_comparisons([0.1, 0.9, 0.5], [0.4, 0.2], "all")
    assert [(c.index, c.target_wins) for c in found] == [(0, False), (1, True)]
