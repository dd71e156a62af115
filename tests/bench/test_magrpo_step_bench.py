"""bench/magrpo_step.py's bookkeeping for side-by-side rounds (no training run here)."""

from __future__ import annotations

import pytest
from bench_loader import load_bench_script


@pytest.fixture(scope="module")
def bench():
    yield from load_bench_script("magrpo_step")


def test_the_sides_take_turns_at_going_first(bench):
    assert [bench.side_order(r, True) for r in range(3)] == [
        ["comlrl", "ours"],
        ["ours", "comlrl"],
        ["comlrl", "ours"],
    ]
    assert bench.side_order(1, False) == ["ours"]


def test_speedup_summary_gives_every_round_and_the_ratio_of_the_means(bench):
    rounds = [
        {"comlrl": {"step_mean_s": 90.0}, "ours": {"fp32": {"step_mean_s": 30.0}}},
        {"comlrl": {"step_mean_s": 100.0}, "ours": {"fp32": {"step_mean_s": 40.0}}},
        {"comlrl": {"error": "timed out"}, "ours": {"fp32": {"step_mean_s": 10.0}}},  # no pair: left out
    ]
    line = bench.speedup_summary(rounds, "fp32")
    assert line.startswith("speed-up by round 3.00x, 2.50x (range 2.50-3.00x)")
    # the ratio of the means (95 / 35), not the mean of the ratios (2.75)
    assert "all rounds 2.71x (CoMLRL 95.00 s, ours 35.00 s per task item)" in line
    assert bench.speedup_summary(rounds, "bf16-mixed") is None
    assert bench.speedup_summary(rounds[2:], "fp32") is None
