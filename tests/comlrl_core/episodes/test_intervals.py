"""Paired bootstrap intervals of a before / after difference (the main job's table)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from comlrl_core.episodes.intervals import compare_episode_rows, paired_bootstrap, per_problem_means

values = st.lists(st.floats(min_value=-10, max_value=10, allow_nan=False), min_size=1, max_size=30)
RESAMPLES = 500  # hypothesis runs many examples; the default (4000) is for the job's table


@settings(max_examples=60, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_interval_contains_the_point_estimate(data, seed):
    before = data.draw(values)
    after = data.draw(st.lists(st.floats(-10, 10, allow_nan=False), min_size=len(before), max_size=len(before)))
    iv = paired_bootstrap(before, after, resamples=RESAMPLES, seed=seed)
    assert iv.low <= iv.difference <= iv.high
    assert iv.difference == pytest.approx(np.mean(after) - np.mean(before), abs=1e-9)
    diffs = np.asarray(after) - np.asarray(before)
    assert diffs.min() - 1e-9 <= iv.low and iv.high <= diffs.max() + 1e-9  # means of resamples


@settings(max_examples=40, deadline=None)
@given(before=values, seed=st.integers(0, 1000))
def test_identical_before_and_after_give_zero_zero(before, seed):
    iv = paired_bootstrap(before, list(before), resamples=RESAMPLES, seed=seed)
    assert (iv.difference, iv.low, iv.high) == (0.0, 0.0, 0.0)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), shift=st.floats(-5, 5, allow_nan=False), seed=st.integers(0, 1000))
def test_a_constant_shift_shifts_the_interval(data, shift, seed):
    before = data.draw(values)
    after = data.draw(st.lists(st.floats(-10, 10, allow_nan=False), min_size=len(before), max_size=len(before)))
    base = paired_bootstrap(before, after, resamples=RESAMPLES, seed=seed)
    moved = paired_bootstrap(before, [a + shift for a in after], resamples=RESAMPLES, seed=seed)
    assert moved.difference == pytest.approx(base.difference + shift, abs=1e-6)
    assert moved.low == pytest.approx(base.low + shift, abs=1e-6)
    assert moved.high == pytest.approx(base.high + shift, abs=1e-6)


def test_the_interval_is_reproducible_and_narrows_with_more_problems():
    rng = np.random.default_rng(3)
    before, after = rng.normal(0, 1, 200), rng.normal(0.5, 1, 200)
    first = paired_bootstrap(before, after, seed=1)
    assert first == paired_bootstrap(before, after, seed=1)
    few = paired_bootstrap(before[:20], after[:20], seed=1)
    assert first.high - first.low < few.high - few.low
    assert first.low > 0.0  # a real shift of 0.5 over 200 problems is detected


def test_unpaired_or_empty_inputs_are_refused():
    with pytest.raises(ValueError, match="same problems"):
        paired_bootstrap([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="at least one problem"):
        paired_bootstrap([], [])
    with pytest.raises(ValueError, match="same"):
        per_problem_means({(0, 0): 1.0}, {(0, 1): 1.0})


def test_per_problem_means_average_each_problems_samples():
    before = {(0, 0): 1.0, (0, 1): 0.0, (1, 0): 0.5, (1, 1): 0.5}
    after = {(0, 0): 1.0, (0, 1): 1.0, (1, 0): 0.0, (1, 1): 1.0}
    assert per_problem_means(before, after) == ([0.5, 0.5], [1.0, 0.5])


def _rows(passed, pass_rate):
    return [
        {"task": i // 2, "sample": i % 2, "passed": p, "return": 2.0 * r, "test_pass_rate": r}
        for i, (p, r) in enumerate(zip(passed, pass_rate, strict=True))
    ]


def test_compare_episode_rows_pairs_episodes_and_reports_pass_at_k():
    before = _rows([False, False, True, False], [0.0, 0.5, 1.0, 0.25])
    after = _rows([True, False, True, True], [1.0, 0.5, 1.0, 1.0])
    table = compare_episode_rows(before, after, k=(1, 2, 3), resamples=200)
    assert set(table) == {"return_mean", "test_pass_rate", "pass@1", "pass@2"}  # k=3 > 2 samples: dropped
    assert table["test_pass_rate"].before == pytest.approx(0.4375)
    assert table["test_pass_rate"].difference == pytest.approx(0.875 - 0.4375)
    assert table["pass@1"].before == pytest.approx(0.25) and table["pass@1"].after == pytest.approx(0.75)
    assert table["pass@2"].after == pytest.approx(1.0)
    assert table["return_mean"].difference == pytest.approx(2 * table["test_pass_rate"].difference)
    # shuffled rows pair by (task, sample), not by position
    assert compare_episode_rows(before, after[::-1], k=(1,), resamples=200)["test_pass_rate"] == table["test_pass_rate"]
