"""Metrics logging (JSONL always, TensorBoard / W&B on request), reading, plotting, progress."""

from __future__ import annotations

import io
import json
import math
import pathlib
import sys
import types
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from comlrl_core.config.options import BaseConfig
from comlrl_core.run.metrics import MetricsLogger, metric_key, plot_metric, read_metrics
from comlrl_core.run.progress import progress, set_postfix


@dataclass
class TinyConfig(BaseConfig):
    learning_rate: float = 1e-5
    num_generations: int = 4


def test_jsonl_lines_and_conversions(tmp_path: pathlib.Path) -> None:
    with MetricsLogger(tmp_path / "run", config=TinyConfig()) as logger:
        logger.log({"turn_1/reward_mean": 0.5, "agent_0/loss": np.float32(1.25)}, step=1)
        # visible on disk before close: every line is flushed
        assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1
        logger.log(
            {
                "eval/pass_rate": torch.tensor(0.75),
                "count": np.int64(3),
                "one_elem": torch.tensor([2.0]),
                "done": True,
                "bad": float("nan"),
                "up": float("inf"),
                "down": -math.inf,
            },
            step=np.int64(2),
        )
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    first, second = (json.loads(line) for line in lines)  # strict JSON: no NaN tokens
    assert first["step"] == 1 and first["turn_1/reward_mean"] == 0.5 and first["agent_0/loss"] == 1.25
    assert isinstance(first["time"], float)
    assert second["eval/pass_rate"] == 0.75 and second["count"] == 3 and second["one_elem"] == 2.0
    assert second["done"] == 1
    assert (second["bad"], second["up"], second["down"]) == ("nan", "inf", "-inf")
    assert "NaN" not in lines[1] and "Infinity" not in lines[1]
    assert json.loads((tmp_path / "run" / "config.json").read_text()) == {
        "learning_rate": 1e-5,
        "num_generations": 4,
    }

    rows = read_metrics(tmp_path / "run")
    assert math.isnan(rows[1]["bad"]) and rows[1]["up"] == math.inf and rows[1]["down"] == -math.inf
    assert rows[0]["turn_1/reward_mean"] == 0.5


def test_logger_appends_and_rejects_bad_input(tmp_path: pathlib.Path) -> None:
    logger = MetricsLogger(tmp_path, config={"a": 1})
    with pytest.raises(TypeError, match=r"metric 'name' must be a number"):
        logger.log({"name": "hello"}, step=0)
    with pytest.raises(TypeError, match=r"metric 'vec' must be a scalar, got Tensor with 3 elements"):
        logger.log({"vec": torch.ones(3)}, step=0)
    with pytest.raises(ValueError, match="reserved"):
        logger.log({"step": 1.0}, step=0)
    with pytest.raises(ValueError, match="non-negative int"):
        logger.log({"x": 1.0}, step=-1)
    with pytest.raises(ValueError, match="non-negative int"):
        logger.log({"x": 1.0}, step=1.5)  # type: ignore[arg-type]
    logger.log({"x": 1.0}, step=0)
    logger.close()
    logger.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        logger.log({"x": 2.0}, step=1)
    with MetricsLogger(tmp_path) as again:  # a resumed run appends
        again.log({"x": 3.0}, step=1)
    assert [r["x"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1.0, 3.0]
    with pytest.raises(ValueError, match=r"unknown logging backend\(s\) \['tensorbord'\]"):
        MetricsLogger(tmp_path, backends=("tensorbord",))


def test_read_metrics_skips_only_a_torn_last_line(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "x": 1}\n{"step": 1, "x": 2}\n{"step": 2, "x"')
    assert [r["x"] for r in read_metrics(path)] == [1, 2]
    path.write_text('{"step": 0, "x": 1}\n{"step": 1, "x\n{"step": 2, "x": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON line"):
        read_metrics(path)


def test_text_and_table_records(tmp_path: pathlib.Path) -> None:
    with MetricsLogger(tmp_path) as logger:
        logger.log_text("samples/main", "def f():\n    return 1", step=3)
        logger.log_table("eval/cases", ["task", "passed"], [["t1", 1], ["t2", 0]], step=3)
        with pytest.raises(ValueError, match="has 1 cells, expected 2"):
            logger.log_table("bad", ["a", "b"], [["only"]], step=3)
    records = [json.loads(line) for line in (tmp_path / "text.jsonl").read_text().splitlines()]
    assert records[0]["text"] == "def f():\n    return 1" and records[0]["key"] == "samples/main"
    assert records[1]["rows"] == [["t1", 1], ["t2", 0]] and records[1]["columns"] == ["task", "passed"]
    assert read_metrics(tmp_path) == []  # text never lands in the metrics file


def test_missing_backend_names_the_extra(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import now fails
    with pytest.raises(ImportError, match=r"pip install 'comlrl-gym\[tb\]'"):
        MetricsLogger(tmp_path / "a", backends=("tensorboard",))
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"pip install 'comlrl-gym\[wandb\]'"):
        MetricsLogger(tmp_path / "b", backends=("wandb",), config={"x": 1})
    assert not (tmp_path / "b" / "config.json").exists()  # failed before writing anything


def test_tensorboard_backend_writes_scalars(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, backends=("tensorboard",), config={"lr": 0.1}) as logger:
        for step in range(3):
            logger.log({"turn_1/reward_mean": step * 0.5}, step=step)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("turn_1/reward_mean")
    assert [(s.step, s.value) for s in scalars] == [(0, 0.0), (1, 0.5), (2, 1.0)]
    assert len(read_metrics(tmp_path)) == 3  # JSONL is written as well


def test_wandb_backend_receives_config_and_metrics(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, list] = {"init": [], "log": [], "finish": []}

    class Run:
        def log(self, data, step):
            calls["log"].append((data, step))

        def finish(self):
            calls["finish"].append(True)

    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: calls["init"].append(kwargs) or Run()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with MetricsLogger(tmp_path, backends=["wandb"], config=TinyConfig(), wandb_kwargs={"project": "p"}) as logger:
        logger.log({"eval/reward": np.float64(0.25)}, step=4)
    assert calls["init"] == [
        {"dir": str(tmp_path), "config": {"learning_rate": 1e-5, "num_generations": 4}, "project": "p"}
    ]
    assert calls["log"] == [({"eval/reward": 0.25}, 4)]
    assert type(calls["log"][0][0]["eval/reward"]) is float
    assert calls["finish"] == [True]


def test_plot_metric(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    with MetricsLogger(tmp_path) as logger:
        for step in range(5):
            logger.log({"turn_1/reward_mean": step / 4, "turn_2/reward_mean": float("nan")}, step=step)
    out = plot_metric(tmp_path, ["turn_1/reward_mean", "turn_2/reward_mean"], tmp_path / "plots" / "r.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    with pytest.raises(KeyError, match=r"not in .*available: turn_1/reward_mean, turn_2/reward_mean"):
        plot_metric(tmp_path, "turn_3/reward_mean", tmp_path / "x.png")


def test_plot_metric_without_matplotlib(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "x": 1}\n')
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install 'comlrl-gym\[viz\]'"):
        plot_metric(tmp_path, "x", tmp_path / "x.png")


def test_metric_key() -> None:
    assert metric_key("reward_mean", turn=2) == "turn_2/reward_mean"
    assert metric_key("expected_return", section="eval", agent=1, turn=1) == "eval/agent_1/turn_1/expected_return"


def test_progress_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()  # not a TTY: off by default
    assert list(progress(range(4), desc="rollouts", file=stream)) == [0, 1, 2, 3]
    assert stream.getvalue() == ""
    monkeypatch.setenv("COMLRL_PROGRESS", "1")
    bar = progress(range(3), desc="rollouts", file=stream)
    for _ in bar:
        set_postfix(bar, {"reward": 0.123456, "loss": torch.tensor(2.0)})
    bar.close()
    text = stream.getvalue()
    assert "rollouts" in text and "3/3" in text and "reward=0.1235" in text and "loss=2" in text
    forced_off = io.StringIO()
    assert list(progress([1, 2], file=forced_off, disable=True)) == [1, 2]
    assert forced_off.getvalue() == ""
