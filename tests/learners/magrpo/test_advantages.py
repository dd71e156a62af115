"""Returns with a discount, cross-mode credit, and the four advantage modes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from magrpo_fakes import CountingEnv, ScriptedPolicy

from learners.magrpo.advantages import agent_credits, compute_returns, group_advantages
from learners.magrpo.tree import build_tree


def _tree(joint_mode, num_turns, reward_fn, threshold=None, G=2):
    env = CountingEnv(num_turns=num_turns, reward_fn=reward_fn, early_termination_threshold=threshold)
    obs, _ = env.reset(options={"task": 0})
    return build_tree(
        env,
        [obs["a0"], obs["a1"]],
        [ScriptedPolicy(), ScriptedPolicy()],
        ["a0", "a1"],
        num_generations=G,
        num_turns=num_turns,
        joint_mode=joint_mode,
    )


def _reward(task, acts, turn):
    # turn 0: reward = index of a0's answer; turn 1: 10 * index of a1's answer
    return float(acts["a0"]) if turn == 0 else 10.0 * float(acts["a1"])


@pytest.mark.parametrize("discount", [1.0, 0.5, 0.0])
def test_returns_two_turns_aligned(discount):
    tree = _tree("aligned", 2, _reward)
    compute_returns(tree, discount)
    child_mean = (0.0 + 10.0) / 2  # children of every turn-1 joint action
    assert [j.ret for j in tree.root.joints] == pytest.approx(
        [0.0 + discount * child_mean, 1.0 + discount * child_mean]
    )
    for joint in tree.root.joints:
        assert [c.ret for c in joint.child.joints] == [0.0, 10.0]  # leaves: return = reward


def test_discount_is_honoured_not_ignored():
    t1, t2 = _tree("aligned", 3, _reward), _tree("aligned", 3, _reward)
    compute_returns(t1, 1.0)
    compute_returns(t2, 0.9)
    assert t1.root.joints[0].ret != pytest.approx(t2.root.joints[0].ret)


def test_terminated_branch_return_is_its_reward():
    tree = _tree("aligned", 2, _reward, threshold=1.0)  # a0 answering "1" terminates at turn 1
    compute_returns(tree, 1.0)
    ended, going = tree.root.joints[1], tree.root.joints[0]
    assert ended.done and ended.child is None and ended.ret == 1.0
    assert going.ret == pytest.approx(0.0 + 5.0)


def test_cross_credit_is_mean_over_joint_actions_containing_the_response():
    tree = _tree("cross", 1, lambda task, acts, turn: 10.0 * float(acts["a0"]) + float(acts["a1"]), G=3)
    compute_returns(tree, 1.0)
    # joint (i, j) -> 10 i + j. a0's response i: mean_j (10 i + j) = 10 i + 1.
    assert agent_credits(tree.root, 0) == pytest.approx([1.0, 11.0, 21.0])
    # a1's response j: mean_i (10 i + j) = 10 + j.
    assert agent_credits(tree.root, 1) == pytest.approx([10.0, 11.0, 12.0])


def test_aligned_credit_is_the_joint_return():
    tree = _tree("aligned", 1, lambda task, acts, turn: 3.0 * float(acts["a0"]), G=3)
    compute_returns(tree, 1.0)
    assert agent_credits(tree.root, 0) == agent_credits(tree.root, 1) == [0.0, 3.0, 6.0]


def test_the_four_modes_differ_on_the_same_returns():
    r = [1.0, 2.0, 6.0]
    adv = {m: group_advantages(r, m) for m in ("mean", "raw", "rloo", "max")}
    assert adv["mean"].tolist() == pytest.approx([-2.0, -1.0, 3.0])
    assert adv["raw"].tolist() == pytest.approx(r)
    assert adv["rloo"].tolist() == pytest.approx([1 - 4.0, 2 - 3.5, 6 - 1.5])
    assert adv["max"].tolist() == pytest.approx([-5.0, -4.0, 0.0])
    values = [tuple(round(x, 6) for x in a.tolist()) for a in adv.values()]
    assert len(set(values)) == 4


def test_normalisation_makes_mean_and_rloo_coincide_up_to_scale():
    r = torch.tensor([1.0, 2.0, 6.0])
    mean_n, rloo_n = group_advantages(r, "mean", True), group_advantages(r, "rloo", True)
    assert (mean_n * 3 / 2).tolist() == pytest.approx(rloo_n.tolist(), rel=1e-5)
    assert mean_n.std(unbiased=False).item() == pytest.approx(1.0, rel=1e-4)


def test_bad_mode_is_named():
    with pytest.raises(ValueError, match="advantage mode"):
        group_advantages([1.0, 2.0], "median")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=2, max_size=8))
def test_mode_invariants(returns):
    r = torch.tensor(returns)
    assert abs(group_advantages(r, "mean").sum().item()) < 1e-3
    assert abs(group_advantages(r, "rloo").sum().item()) < 1e-2
    assert group_advantages(r, "max").max().item() == pytest.approx(0.0, abs=1e-4)
    # shifting every return leaves the baselined modes unchanged
    for mode in ("mean", "rloo", "max"):
        shifted = group_advantages(r + 7.0, mode)
        assert torch.allclose(shifted, group_advantages(r, mode), atol=1e-3)


@settings(max_examples=80, deadline=None)
@given(
    st.floats(-100, 100, allow_nan=False),
    st.integers(1, 8),
    st.sampled_from(["mean", "rloo", "max"]),
    st.booleans(),
)
@example(0.1, 7, "mean", True).via("r - r.mean() is off by an ulp here")
@example(0.7, 8, "rloo", False).via("so is the leave-one-out mean")
def test_identical_returns_give_exactly_zero_advantages(value, size, mode, normalize):
    # exactly: the update skips such groups, and normalising an ulp of noise by a ~0 std
    # would otherwise turn it into a visible advantage
    adv = group_advantages([value] * size, mode, normalize)
    assert torch.equal(adv, torch.zeros(size))


def test_identical_returns_are_examples_where_the_formula_alone_is_off_by_an_ulp():
    # the cases the explicit check exists for (float32: 7 * 0.1 does not sum back to 0.7)
    r = torch.tensor([0.1] * 7)
    assert (r - r.mean()).abs().max() > 0
    assert torch.equal(group_advantages(r, "mean"), torch.zeros(7))
    assert torch.equal(group_advantages(r, "raw"), r)  # raw has no baseline: returns as they are
