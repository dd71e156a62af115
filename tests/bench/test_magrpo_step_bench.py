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


def _round(theirs: float | None, ours: float | None, peak: float | None = 6.0) -> dict:
    fp32 = {} if ours is None else {"step_mean_s": ours}
    if peak is not None:
        fp32["peak_rss_gib"] = peak
    side = {"ours": {"fp32": fp32}}
    if theirs is not None:
        side["comlrl"] = {"step_mean_s": theirs}
    return side


def _issue_spec(bench, **changes) -> dict:
    return {**bench.ISSUE_SETTING, "release_freed_memory": "phase", "steps": 3, **changes}


def test_target_lines_mark_the_speed_target_per_round_and_on_the_means(bench):
    spec = _issue_spec(bench)
    met = bench.target_lines(spec, [_round(90.0, 30.0), _round(99.0, 30.0)])
    assert met[0].endswith("3.15x (2 round(s), rounds 3.00-3.30x) -> met")
    # 2.9x and 3.3x: the means reach 3x (186 / 60 = 3.10x), one round does not
    means_only = bench.target_lines(spec, [_round(87.0, 30.0), _round(99.0, 30.0)])
    assert means_only[0].endswith("3.10x (2 round(s), rounds 2.90-3.30x) -> met on the means, not in every round")
    missed = bench.target_lines(spec, [_round(178.5, 68.8)])
    assert missed[0].endswith("2.59x (1 round(s)) -> not met")
    assert "not the library's default" not in missed[0]


def test_target_lines_judge_our_worst_peak_and_name_a_non_default_release(bench):
    spec = _issue_spec(bench, release_freed_memory="never")
    lines = bench.target_lines(spec, [_round(90.0, 30.0, peak=6.05), _round(90.0, 30.0, peak=6.40)])
    assert "release_freed_memory=never, not the library's default" in lines[0]
    assert lines[1].endswith("6.40 GiB -> not met")  # the worst round counts
    assert bench.target_lines(spec, [_round(90.0, 30.0, peak=6.34)])[1].endswith("6.34 GiB -> met")


def test_target_lines_say_what_was_not_measured_and_skip_other_settings(bench):
    spec = _issue_spec(bench)
    alone = bench.target_lines(spec, [_round(None, 30.0)])  # no CoMLRL side
    assert "not measured (pass --comlrl-python" in alone[0]
    no_fp32 = bench.target_lines(
        spec, [{"ours": {"bf16-mixed": {"step_mean_s": 20.0}}, "comlrl": {"step_mean_s": 90.0}}]
    )
    assert "not measured" in no_fp32[0] and "not measured" in no_fp32[1]
    assert bench.target_lines(_issue_spec(bench, mode="lora"), [_round(90.0, 30.0)]) == []
    assert bench.target_lines(_issue_spec(bench, G=2), [_round(90.0, 30.0)]) == []
