"""Replay buffer: exact lambda weights, apportioning and within-round draws (hypothesis),
round files, checkpoint state, and option validation."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learners.preference.records import PreferencePair, read_round
from learners.preference.replay import ReplayBuffer, apportion, check_replay_options, draw_from_round, lambda_weights


def pair(tag: str, reward: float = 1.0) -> PreferencePair:
    return PreferencePair(
        prompts=[f"p-{tag}", "q"],
        winner_completions=[tag, "w"],
        loser_completions=["l", "l"],
        winner_reward=reward,
        loser_reward=0.0,
        candidate_reward_mean=reward / 2,
    )


def test_lambda_weights_exact():
    assert lambda_weights(3, 0.5) == pytest.approx([0.25 / 1.75, 0.5 / 1.75, 1 / 1.75])  # oldest first
    assert lambda_weights(3, 0.0) == [0.0, 0.0, 1.0]  # only the newest
    assert lambda_weights(4, 1.0) == pytest.approx([0.25] * 4)  # all equal
    assert lambda_weights(1, 0.3) == [1.0]
    assert lambda_weights(0, 0.3) == []


@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 200), weights=st.lists(st.floats(0, 10), min_size=1, max_size=8))
def test_apportion_is_exact_up_to_rounding(total, weights):
    counts = apportion(total, weights)
    wsum = sum(weights)
    if wsum == 0:
        assert counts == [0] * len(weights)
        return
    assert sum(counts) == total
    for c, w in zip(counts, weights, strict=True):
        assert abs(c - total * w / wsum) < 1 + 1e-9
        if w == 0:
            assert c == 0


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 9), count=st.integers(0, 40), seed=st.integers(0, 99))
def test_draws_without_replacement_then_cycle(n, count, seed):
    items = list(range(n))
    out = draw_from_round(items, count, random.Random(seed))
    assert len(out) == count
    seen = Counter(out)
    assert set(seen) <= set(items)
    full, rest = divmod(count, n)
    assert all(full <= seen[i] <= full + 1 for i in items)
    assert sum(seen[i] == full + 1 for i in items) == rest
    for start in range(0, count - n + 1, n):  # every complete block is a permutation
        assert sorted(out[start : start + n]) == items


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 5), min_size=1, max_size=6),
    mode=st.sampled_from(["nearest_k", "all_history", "lambda_decay"]),
    seed=st.integers(0, 20),
    sample=st.none() | st.integers(1, 12),
)
def test_historical_selection_draws_from_the_right_rounds(tmp_path_factory, sizes, mode, seed, sample):
    k = 2 if mode == "nearest_k" else None
    lam = 0.0 if mode == "lambda_decay" else None
    buf = ReplayBuffer(tmp_path_factory.mktemp("r"), mode, k, lam, sample)
    for it, size in enumerate(sizes, start=1):
        buf.add_round(it, [pair(f"{it}.{j}") for j in range(size)])
    picked = buf.select(random.Random(seed))
    nonempty = [it for it, s in enumerate(sizes, start=1) if s]
    if not nonempty:
        assert picked == []
        return
    expected_size = sample if sample is not None else (sizes[-1] or sizes[nonempty[-1] - 1])
    assert len(picked) == expected_size
    rounds = {int(p.winner_completions[0].split(".")[0]) for p in picked}
    allowed = {"nearest_k": nonempty[-2:], "all_history": nonempty, "lambda_decay": nonempty[-1:]}[mode]
    assert rounds <= set(allowed)
    if mode == "all_history" and expected_size >= len(nonempty):
        assert rounds == set(nonempty)  # equal weights: every round gets a share


def test_rounds_are_weighted_equally_whatever_their_size(tmp_path):
    buf = ReplayBuffer(tmp_path, "all_history", sample_size=10)
    buf.add_round(1, [pair(f"1.{j}") for j in range(100)])
    buf.add_round(2, [pair("2.0")])
    counts = Counter(p.winner_completions[0].split(".")[0] for p in buf.select(random.Random(0)))
    assert counts == {"1": 5, "2": 5}


def test_current_mode_returns_this_round_and_files_are_written(tmp_path):
    buf = ReplayBuffer(tmp_path, "current")
    buf.add_round(1, [pair("a"), pair("b")])
    buf.add_round(2, [])
    assert buf.select(random.Random(0)) == []
    payload = json.loads((tmp_path / "iteration_0001.json").read_text())
    assert payload["iteration"] == 1 and payload["num_pairs"] == 2 and len(payload["pairs"]) == 2
    assert set(payload["pairs"][0]) >= {
        "prompts",
        "winner_completions",
        "loser_completions",
        "winner_reward",
        "loser_reward",
        "candidate_reward_mean",
    }
    assert json.loads((tmp_path / "iteration_0002.json").read_text()) == {"iteration": 2, "num_pairs": 0, "pairs": []}
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]


def test_default_sample_size_falls_back_to_latest_nonempty(tmp_path):
    buf = ReplayBuffer(tmp_path, "all_history")
    buf.add_round(1, [pair("a"), pair("b"), pair("c")])
    buf.add_round(2, [])
    assert len(buf.select(random.Random(1))) == 3


def test_old_run_folder_imports_nothing_and_state_restores_files(tmp_path):
    old = ReplayBuffer(tmp_path, "all_history")
    old.add_round(1, [pair("old")])
    fresh = ReplayBuffer(tmp_path, "all_history")
    assert fresh.rounds == [] and fresh.select(random.Random(0)) == []
    fresh.add_round(1, [pair("new1"), pair("new2")])
    state, files = fresh.state_dict(), fresh.files()
    (tmp_path / "iteration_0001.json").write_text("garbage")
    restored = ReplayBuffer(tmp_path, "all_history")
    restored.load_state_dict(state, files)
    assert [p.winner_completions[0] for p in read_round(tmp_path / "iteration_0001.json")] == ["new1", "new2"]
    assert len(restored.select(random.Random(0))) == 2


@pytest.mark.parametrize(
    "args,match",
    [
        (("current", 2, None, None), "preference_replay_k"),
        (("current", None, 0.5, None), "preference_replay_lambda"),
        (("current", None, None, 4), "preference_replay_sample_size"),
        (("nearest_k", None, None, None), "preference_replay_k"),
        (("lambda_decay", None, None, None), "preference_replay_lambda"),
        (("lambda_decay", None, 1.5, None), "preference_replay_lambda"),
        (("all_history", 2, None, None), "preference_replay_k"),
        (("bogus", None, None, None), "preference_replay_mode"),
    ],
)
def test_bad_replay_options(args, match):
    with pytest.raises(ValueError, match=match):
        check_replay_options(*args)
    check_replay_options("current", 1, None, None)  # k=1 is allowed with current
