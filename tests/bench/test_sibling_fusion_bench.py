"""bench/sibling_fusion.py runs end to end on the tiny model and prints its table.

Only the structure and the token check are asserted (both settings measured at every batch,
the greedy tokens compared, the switch left on), never the speed.
"""

from __future__ import annotations

import pytest
from bench_loader import load_bench_script
from onednn_marks import needs_onednn

from comlrl_core.models.cpu import fp32_layout, packed_linear


@pytest.fixture(scope="module")
def bench():
    yield from load_bench_script("sibling_fusion")


@needs_onednn
def test_both_settings_are_measured_at_every_batch_with_the_same_tokens(bench, capsys, monkeypatch):
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")  # the tiny model is too small to be measured
    flips: list[bool] = []
    real_units = packed_linear.onednn_units

    def recording_units(model, walk=None):
        flips.append(packed_linear.FUSE_SIBLINGS)
        return real_units(model, walk)

    monkeypatch.setattr(packed_linear, "onednn_units", recording_units)
    bench.main(
        ["--model", "tiny-random", "--kinds", "full,lora", "--batches", "4,6", "--repeats", "2"]
        + ["--new-tokens", "6", "--greedy-tokens", "5", "--prompt-tokens", "24"]
    )
    out = capsys.readouterr().out
    assert "CPU: " in out and "UTC" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| batch")]
    assert [row.split("|")[1].strip() for row in rows] == ["4", "6", "4", "6"]
    assert all(row.rstrip().endswith("| yes |") for row in rows)  # the same greedy tokens
    assert all(row.count("x |") == 1 for row in rows)  # the ratio of medians
    assert True in flips and False in flips  # both settings really ran
    assert packed_linear.FUSE_SIBLINGS is True
