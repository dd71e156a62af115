"""Re-run steps replace their metrics rows; a task option of the wrong type is named as such."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reliability_helpers import metric_steps, tiny_train_args, write_passages

from comlrl_core.cli import main as comlrl_main
from comlrl_core.registry import make
from comlrl_core.run.metrics import MetricsLogger, read_metrics, rewind_metrics

# -- metrics ----------------------------------------------------------------------------------


def _write_rows(path, rows):
    path.write_text("".join(json.dumps({"step": s, "time": t, "x": i}) + "\n" for i, (s, t) in enumerate(rows)))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 8), st.floats(0, 100, allow_nan=False)), max_size=20),
    step=st.integers(0, 8),
    saved_at=st.floats(0, 100, allow_nan=False) | st.none(),
)
def test_rewind_keeps_exactly_the_rows_logged_before_the_checkpoint(tmp_path_factory, rows, step, saved_at):
    path = tmp_path_factory.mktemp("m") / "metrics.jsonl"
    _write_rows(path, rows)
    dropped = rewind_metrics(path, step, saved_at)
    expect = [i for i, (s, t) in enumerate(rows) if s < step or (s == step and (saved_at is None or t <= saved_at))]
    assert [r["x"] for r in read_metrics(path)] == expect
    assert dropped == len(rows) - len(expect)


def test_rewind_lets_an_open_logger_append_in_place(tmp_path):
    logger = MetricsLogger(tmp_path)
    for step in (1, 2, 3):
        logger.log({"r": float(step)}, step=step)
    assert rewind_metrics(tmp_path, 1) == 2
    logger.log({"r": 20.0}, step=2)  # the re-run step 2
    logger.close()
    assert [(r["step"], r["r"]) for r in read_metrics(tmp_path)] == [(1, 1.0), (2, 20.0)]


def test_rewind_drops_a_torn_last_line_and_tolerates_no_file(tmp_path):
    assert rewind_metrics(tmp_path, 3) == 0
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "time": 1.0}\n{"step": 2, "ti')
    assert rewind_metrics(tmp_path, 5) == 1
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "time": 1.0}\n'


def test_resumed_trainer_replaces_the_rows_of_re_run_steps(tmp_path):
    data = write_passages(tmp_path)
    run_dir = tmp_path / "run"
    assert comlrl_main(tiny_train_args(run_dir, data, "max_steps=3", "save_steps=1")) == 0
    # as if the run died after logging step 3 but before its checkpoint was complete
    shutil.rmtree(run_dir / "checkpoints" / "checkpoint-000003")
    assert comlrl_main(tiny_train_args(run_dir, data, "max_steps=3", "save_steps=1", flags=("--resume",))) == 0
    assert metric_steps(run_dir) == [1, 2, 3]


# -- env input --------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["3", 1.0, [1], True])
def test_reset_names_a_task_option_of_the_wrong_type(tmp_path, bad):
    data = tmp_path / "p.json"
    data.write_text(json.dumps([{"passage": "a short passage"}] * 5))
    env = make("comlrl/Writing-v0", data_file=str(data))
    with pytest.raises(TypeError, match=f"task index must be an int, got {type(bad).__name__}"):
        env.reset(options={"task": bad})
    with pytest.raises(IndexError, match="out of range"):
        env.reset(options={"task": 5})
    obs, _ = env.reset(options={"task": 3})
    assert obs
    env.close()
