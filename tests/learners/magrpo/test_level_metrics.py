"""MAGRPO logs the env's reward levels (infos["levels"]) per step as ``level/{name}``."""

from __future__ import annotations

import pytest

from learners.magrpo.groups import forest_metrics
from learners.magrpo.tree import JointAction, RolloutTree, TreeNode, _info_levels


def test_info_levels_reads_the_numbers_under_levels():
    infos = {"aux": {"levels": {"tests": 0.5, "syntax": 1, "cooperation": None}}, "main": {}}
    assert _info_levels(infos) == {"tests": 0.5, "syntax": 1.0}
    assert _info_levels({"a": {"raw_reward": 1.0}}) == {} and _info_levels(None) == {}


def test_tree_metrics_average_each_level_over_every_step_of_the_tree():
    def node(turn, levels):
        return TreeNode(turn=turn, prompts=["p"], joints=[JointAction(indices=(0,), levels=lv) for lv in levels])

    first = node(1, [{"tests": 0.0, "cooperation": 1.0}, {"tests": 1.0, "cooperation": 0.0}])
    second = node(2, [{"tests": 0.5, "cooperation": 1.0}, {"tests": 0.5}])
    tree = RolloutTree(root=first, levels=[[first], [second]])
    metrics = forest_metrics([tree])
    assert metrics["level/tests"] == pytest.approx(0.5)
    assert metrics["level/cooperation"] == pytest.approx(2 / 3)  # steps that report it
    assert "turn_1/reward_mean" in metrics
