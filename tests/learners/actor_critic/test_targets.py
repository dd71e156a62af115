"""TD targets and advantages on episodes computed by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learners.actor_critic.targets import (
    discounted_returns,
    normalize,
    q_advantages,
    td_targets,
    update_targets,
    v_advantages,
)

# Episode A ran all 3 turns; episode B ended early after 2 (no bootstrap after its last turn).
REWARDS = [[1.0, 0.0, 2.0], [0.3, 1.0]]
VALUES = [[0.5, 0.2, 0.4], [0.1, 0.7]]


def test_one_step_td_targets_by_hand():
    assert td_targets(REWARDS[0], VALUES[0], 0.9) == pytest.approx([1.0 + 0.9 * 0.2, 0.0 + 0.9 * 0.4, 2.0])
    assert td_targets(REWARDS[1], VALUES[1], 0.9) == pytest.approx([0.3 + 0.9 * 0.7, 1.0])


def test_no_bootstrap_after_the_last_turn_whatever_its_value():
    assert td_targets([0.5], [100.0], 1.0) == [0.5]
    assert td_targets([0.0, 0.5], [7.0, -100.0], 1.0) == pytest.approx([-100.0, 0.5])


def test_discount_zero_gives_the_rewards():
    assert td_targets([1.0, 2.0, 3.0], [9.0, 9.0, 9.0], 0.0) == [1.0, 2.0, 3.0]


def test_v_advantages_are_td_errors():
    assert v_advantages([1.18, 0.36, 2.0], VALUES[0]) == pytest.approx([0.68, 0.16, 1.6])


def test_update_targets_v_without_normalisation():
    targets, adv = update_targets(REWARDS, VALUES, discount=0.9, critic_type="v", advantage_normalization=False)
    assert targets[0] == pytest.approx([1.18, 0.36, 2.0])
    assert targets[1] == pytest.approx([0.93, 1.0])
    assert adv[0] == pytest.approx([0.68, 0.16, 1.6])
    assert adv[1] == pytest.approx([0.83, 0.3])


def test_update_targets_v_normalised_turn_by_turn():
    _, adv = update_targets(REWARDS, VALUES, discount=0.9, critic_type="v", advantage_normalization=True)
    # turn 1: [0.68, 0.83] -> [-1, 1]; turn 2: [0.16, 0.30] -> [-1, 1]; turn 3: one value, unchanged
    assert adv[0] == pytest.approx([-1.0, -1.0, 1.6])
    assert adv[1] == pytest.approx([1.0, 1.0])


def test_update_targets_q_uses_q_minus_the_turn_mean():
    targets, adv = update_targets(REWARDS, VALUES, discount=0.9, critic_type="q", advantage_normalization=False)
    assert targets[0] == pytest.approx([1.18, 0.36, 2.0])  # same bootstrap (SARSA-style on the next Q)
    assert adv[0] == pytest.approx([0.2, -0.25, 0.0])
    assert adv[1] == pytest.approx([-0.2, 0.25])


def test_discounted_returns_by_hand():
    assert discounted_returns([1.0, 0.0, 2.0], 0.5) == pytest.approx([1.5, 1.0, 2.0])


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="rewards but"):
        td_targets([1.0], [1.0, 2.0], 0.9)
    with pytest.raises(ValueError, match="discount"):
        td_targets([1.0], [1.0], 1.5)
    with pytest.raises(ValueError, match="critic_type"):
        update_targets(REWARDS, VALUES, discount=0.9, critic_type="x", advantage_normalization=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=20))
def test_normalize_gives_zero_mean_unit_std(values):
    out = normalize(values)
    mean = sum(out) / len(out)
    assert mean == pytest.approx(0.0, abs=1e-6)
    spread = max(values) - min(values)
    if spread > 1e-3:
        var = sum((x - mean) ** 2 for x in out) / len(out)
        assert var == pytest.approx(1.0, rel=1e-4)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=1, max_size=10), st.floats(0, 1))
def test_targets_equal_rewards_when_values_are_zero(rewards, discount):
    assert td_targets(rewards, [0.0] * len(rewards), discount) == pytest.approx(rewards)


@given(st.lists(st.floats(-5, 5), min_size=1, max_size=10))
def test_q_advantages_sum_to_zero(qs):
    assert sum(q_advantages(qs)) == pytest.approx(0.0, abs=1e-6)
