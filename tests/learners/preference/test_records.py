"""Preference records: CoMLRL keys, round trip, atomic round files."""

from __future__ import annotations

import json

import pytest

from learners.preference.records import PreferencePair, read_round, write_round


def test_record_round_trip_and_keys(tmp_path):
    pair = PreferencePair(
        ["p0", "p1"],
        ["w0", "w1"],
        ["l0", "l1"],
        1.0,
        0.5,
        0.7,
        raw_rewards=[2.0, 1.0],
        target_raw_reward=2.0,
        comparator_raw_reward=1.0,
        prompt_ids=[[1], [2]],
        winner_ids=[[3, 0], [4, 0]],
        loser_ids=[[5, 0], [6, 0]],
    )
    rec = pair.to_record()
    assert {
        "prompts",
        "winner_completions",
        "loser_completions",
        "winner_reward",
        "loser_reward",
        "candidate_reward_mean",
        "raw_rewards",
        "target_raw_reward",
        "comparator_raw_reward",
    } <= set(rec)
    assert PreferencePair.from_record(json.loads(json.dumps(rec))) == pair
    base = PreferencePair(["p"], ["w"], ["l"], 1.0, 0.0, 0.5).to_record()
    assert set(base) == {
        "prompts",
        "winner_completions",
        "loser_completions",
        "winner_reward",
        "loser_reward",
        "candidate_reward_mean",
    }
    path = write_round(tmp_path, 3, [pair])
    assert path.name == "iteration_0003.json"
    assert json.loads(path.read_text())["num_pairs"] == 1 and read_round(path) == [pair]


def test_bad_pairs_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="per agent"):
        PreferencePair(["p0", "p1"], ["w0"], ["l0", "l1"], 1.0, 0.0, 0.5)
    with pytest.raises(ValueError, match="non-finite"):
        write_round(tmp_path, 1, [PreferencePair(["p"], ["w"], ["l"], float("nan"), 0.0, 0.5)])
    assert not list(tmp_path.iterdir())
