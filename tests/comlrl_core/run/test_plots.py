"""The main job's figures: training reward (raw, smoothed, levels) and before / after intervals."""

from __future__ import annotations

import pathlib

import pytest

from comlrl_core.run.metrics import MetricsLogger, plot_before_after, plot_training_reward, trailing_mean

pytest.importorskip("matplotlib")


def test_trailing_mean_smooths_over_the_window():
    assert trailing_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert trailing_mean([2.0, 4.0], 1) == [2.0, 4.0]
    with pytest.raises(ValueError, match="window"):
        trailing_mean([1.0], 0)


def _png(path: pathlib.Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_training_reward_figure_draws_raw_smoothed_and_levels(tmp_path):
    logger = MetricsLogger(tmp_path)
    for step in range(1, 7):
        logger.log({"turn_1/expected_return": step / 2, "level/tests": step / 10, "level/syntax": 1.0}, step=step)
    logger.close()
    out = plot_training_reward(
        tmp_path / "metrics.jsonl",
        "turn_1/expected_return",
        ["level/tests", "level/syntax", "level/never_logged"],
        tmp_path / "curve.png",
        window=3,
    )
    assert out == tmp_path / "curve.png" and _png(out)
    with pytest.raises(KeyError, match="missing_key"):
        plot_training_reward(tmp_path / "metrics.jsonl", "missing_key", [], tmp_path / "x.png")


def test_before_after_figure_has_error_bars(tmp_path):
    rows = {
        "return_mean": {"before": 1.0, "after": 1.5, "difference": 0.5, "low": 0.2, "high": 0.8},
        "test_pass_rate": {"before": 0.2, "after": 0.3, "difference": 0.1, "low": -0.05, "high": 0.25},
    }
    out = plot_before_after(rows, tmp_path / "components.png", title="t")
    assert _png(out)
    with pytest.raises(ValueError, match="at least one metric"):
        plot_before_after({}, tmp_path / "none.png")
