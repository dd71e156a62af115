"""bench/learning.py runs end to end in its quick mode and prints the learning table.

Quick mode trains MAGRPO and MADPO (tiny random model, 2 steps, seed 0) in fresh
subprocesses; only the structure is checked (a row per run with before / after / paired
interval, the per-learner summary, the machine header, the markdown file), never whether
the tiny model improves.
"""

from __future__ import annotations

import pathlib

import pytest
from bench_loader import load_bench_script


@pytest.fixture(scope="module")
def bench():
    yield from load_bench_script("learning")


def test_quick_run_prints_a_row_per_run_and_a_summary_per_learner(bench, tmp_path):
    lines: list[str] = []
    out = tmp_path / "learning.md"
    results = bench.main(["--quick", "--run-root", str(tmp_path / "runs"), "--out", str(out)], log=lines.append)

    assert [(r.learner, r.seed) for r in results] == [("magrpo", 0), ("madpo", 0)]
    for r in results:
        assert r.error is None, r.error
        i = r.interval
        assert i.num_problems == 2  # the --eval-tasks of quick mode, each a paired problem
        assert i.low <= i.difference <= i.high
        assert i.difference == pytest.approx(i.after - i.before)
        assert 0.0 <= i.before <= 3.0 and 0.0 <= i.after <= 3.0  # Writing's team reward lies in [0, 3]
        assert r.wall_s > 0

    text = "\n".join(lines)
    assert "CPU: " in text and "UTC" in text and "command: bench/learning.py --quick" in text
    tables = [line for line in lines if line.startswith("| ")]
    per_run = [line for line in tables if line.startswith(("| MAGRPO | 0 |", "| MADPO | 0 |"))]
    assert len(per_run) == 4  # the progress row and the final table row of each run
    header = "| learner | seed | before | after | after - before [95% CI] | improved | wall s |"
    assert header in lines
    assert all(line.count("|") == header.count("|") for line in per_run)
    summary = [line for line in tables if line.startswith(("| MAGRPO | 1/1 |", "| MADPO | 1/1 |"))]
    assert len(summary) == 2

    written = out.read_text()
    assert header in written and "| MADPO | 1/1 |" in written and "- CPU: " in written


def test_before_is_read_from_the_rl_backend_for_marlhf(bench, tmp_path):
    """MARLHF's first evaluation runs inside its RL backend's folder; the others' in the run's."""
    import json

    def write(folder: pathlib.Path, *rewards: float) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "eval_episodes.jsonl").open("w") as fh:
            for r in rewards:
                fh.write(json.dumps({"seed": 0, "episodes": [{"task": 0, "sample": 0, "return": r}]}) + "\n")

    write(tmp_path / "plain", 0.1, 0.5, 0.9)
    before, after = bench.before_after("magrpo", tmp_path / "plain")
    assert before[0]["return"] == 0.1 and after[0]["return"] == 0.9

    write(tmp_path / "rlhf", 0.8)
    write(tmp_path / "rlhf" / "rl", 0.2, 0.7)
    before, after = bench.before_after("marlhf", tmp_path / "rlhf")
    assert before[0]["return"] == 0.2 and after[0]["return"] == 0.8

    write(tmp_path / "iter", 0.6)
    write(tmp_path / "iter" / "rl" / "iteration_0001", 0.5, 0.55)
    write(tmp_path / "iter" / "rl" / "iteration_0000", 0.3, 0.4)
    before, after = bench.before_after("marlhf_iter", tmp_path / "iter")
    assert before[0]["return"] == 0.3 and after[0]["return"] == 0.6

    write(tmp_path / "only_final", 0.4)
    with pytest.raises(ValueError, match="before training"):
        bench.before_after("madpo", tmp_path / "only_final")
