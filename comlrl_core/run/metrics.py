"""Metrics logging: always JSONL, plus TensorBoard / Weights & Biases when asked for.

``run_dir/metrics.jsonl`` holds one JSON object per :meth:`MetricsLogger.log` call::

    {"step": 10, "time": 1733150000.123, "turn_1/reward_mean": 0.42, "eval/pass_rate": "nan"}

Decisions (documented here because readers depend on them):

* The file is flushed after every line, so a crash loses at most the line being written;
  :func:`read_metrics` skips a torn last line.
* JSON has no NaN/Infinity. Non-finite values are written as the strings ``"nan"``,
  ``"inf"`` and ``"-inf"`` (strict JSON, and unlike ``null`` it says which one);
  :func:`read_metrics` turns them back into floats.
* numpy and torch scalars (and one-element tensors) are converted to Python numbers;
  bools become 0/1. Anything else is a ``TypeError`` naming the metric.
* ``step`` and ``time`` are reserved names.
* A run resumed from a checkpoint re-runs the steps after it: :func:`rewind_metrics`
  drops the rows logged after that checkpoint was saved, so the re-run rows replace
  them instead of appearing twice.

Metric names follow the project convention: ``turn_{t}/reward_mean``, ``eval/...``,
``iter/...`` and ``agent_{i}/`` prefixes (see :func:`metric_key`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import pathlib
import time
from typing import Any, Iterable, Mapping, Sequence, TextIO

__all__ = [
    "MetricsLogger",
    "metric_key",
    "plot_before_after",
    "plot_metric",
    "plot_training_reward",
    "read_metrics",
    "rewind_metrics",
    "trailing_mean",
]

BACKENDS = ("jsonl", "tensorboard", "wandb")
_RESERVED = ("step", "time")
_NON_FINITE_TEXT = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def metric_key(name: str, *, section: str | None = None, agent: int | None = None, turn: int | None = None) -> str:
    """Compose a metric name: ``[section/][agent_{i}/][turn_{t}/]name``.

    >>> metric_key("reward_mean", turn=1)
    'turn_1/reward_mean'
    >>> metric_key("loss", section="eval", agent=0)
    'eval/agent_0/loss'
    """
    parts = []
    if section:
        parts.append(section)
    if agent is not None:
        parts.append(f"agent_{agent}")
    if turn is not None:
        parts.append(f"turn_{turn}")
    parts.append(name)
    return "/".join(parts)


def _to_number(key: str, value: Any) -> float | int:
    """A Python int/float from a Python, numpy or torch scalar."""
    if isinstance(value, bool):
        return int(value)
    if type(value) in (int, float):
        return value
    if isinstance(value, (int, float)):  # subclasses such as numpy.float64
        return float(value) if isinstance(value, float) else int(value)
    item = getattr(value, "item", None)  # numpy scalars / arrays, torch tensors
    if callable(item):
        size = getattr(value, "size", None)
        numel = getattr(value, "numel", None)
        count = size if isinstance(size, int) else (numel() if callable(numel) else 1)
        if count != 1:
            raise TypeError(f"metric {key!r} must be a scalar, got {type(value).__name__} with {count} elements")
        return _to_number(key, item())
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(
        f"metric {key!r} must be a number (Python, numpy or torch scalar), got {type(value).__name__}; "
        "use log_text for strings"
    )


def _json_number(value: float | int) -> float | int | str:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _plain_config(config: Any) -> Any:
    if config is None:
        return None
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if isinstance(config, Mapping):
        return dict(config)
    raise TypeError(f"config must be a BaseConfig, dataclass or mapping, got {type(config).__name__}")


def _missing_backend(backend: str, package: str, extra: str) -> ImportError:
    return ImportError(
        f"the '{backend}' logging backend needs the '{package}' package, which is not installed; "
        f"install it with: pip install 'comlrl-gym[{extra}]'  (or drop '{backend}' from backends)"
    )


class MetricsLogger:
    """Write scalar metrics for a run.

    ``backends``: any of ``"jsonl"`` (always on), ``"tensorboard"`` (needs the ``tb``
    extra; event files under ``tensorboard_dir``, default ``run_dir/tensorboard``) and ``"wandb"`` (needs ``wandb``;
    ``wandb_kwargs`` go to ``wandb.init``). ``config`` (a config, dataclass or mapping) is
    saved to ``run_dir/config.json`` and handed to the backends.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        backends: Sequence[str] = ("jsonl",),
        config: Any = None,
        *,
        wandb_kwargs: Mapping[str, Any] | None = None,
        tensorboard_dir: str | os.PathLike | None = None,
    ) -> None:
        if isinstance(backends, str):
            backends = (backends,)
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise ValueError(f"unknown logging backend(s) {unknown}; allowed: {', '.join(BACKENDS)}")
        self.run_dir = pathlib.Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.backends = tuple(dict.fromkeys(("jsonl", *backends)))
        self.config = _plain_config(config)
        self._closed = False
        self._tb = None
        self._wandb_run = None
        # Import optional backends first: a missing package fails before any file is written.
        if "tensorboard" in self.backends:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise _missing_backend("tensorboard", "tensorboard", "tb") from None
            self._tb = SummaryWriter(log_dir=str(tensorboard_dir or self.run_dir / "tensorboard"))
        if "wandb" in self.backends:
            try:
                import wandb
            except ImportError:
                raise _missing_backend("wandb", "wandb", "wandb") from None
            kwargs = {"dir": str(self.run_dir), "config": self.config, **(wandb_kwargs or {})}
            self._wandb_run = wandb.init(**kwargs)
        if self.config is not None:
            text = json.dumps(self.config, indent=2, sort_keys=False, default=str)
            tmp = self.run_dir / "config.json.tmp"
            tmp.write_text(text + "\n", encoding="utf-8")
            os.replace(tmp, self.run_dir / "config.json")
            if self._tb is not None:
                self._tb.add_text("config", "```json\n" + text + "\n```", 0)
        self._metrics_file = open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8")
        self._text_file: TextIO | None = None

    @property
    def metrics_path(self) -> pathlib.Path:
        return self.run_dir / "metrics.jsonl"

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("MetricsLogger is closed")

    @staticmethod
    def _check_step(step: Any) -> int:
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        return int(step)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record scalar ``metrics`` at ``step`` in every backend."""
        self._check_open()
        step = self._check_step(step)
        values: dict[str, float | int] = {}
        for key, value in metrics.items():
            if not isinstance(key, str) or not key:
                raise TypeError(f"metric names must be non-empty strings, got {key!r}")
            if key in _RESERVED:
                raise ValueError(f"metric name {key!r} is reserved (the line already has it)")
            values[key] = _to_number(key, value)
        line = {"step": step, "time": time.time(), **{k: _json_number(v) for k, v in values.items()}}
        self._metrics_file.write(json.dumps(line, allow_nan=False) + "\n")
        self._metrics_file.flush()
        if self._tb is not None:
            for key, value in values.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb_run is not None:
            self._wandb_run.log(dict(values), step=step)

    def log_text(self, key: str, text: str, step: int) -> None:
        """Record a text sample (e.g. a completion) to ``run_dir/text.jsonl`` and the backends."""
        self._check_open()
        step = self._check_step(step)
        if self._text_file is None:
            self._text_file = open(self.run_dir / "text.jsonl", "a", encoding="utf-8")
        self._text_file.write(json.dumps({"step": step, "time": time.time(), "key": key, "text": str(text)}) + "\n")
        self._text_file.flush()
        if self._tb is not None:
            self._tb.add_text(key, str(text), step)
        if self._wandb_run is not None:
            import wandb

            self._wandb_run.log({key: wandb.Html(f"<pre>{_escape_html(str(text))}</pre>")}, step=step)

    def log_table(self, key: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], step: int) -> None:
        """Record a small table (stored as a JSON line in ``run_dir/text.jsonl`` too)."""
        rows = [list(r) for r in rows]
        for r in rows:
            if len(r) != len(columns):
                raise ValueError(f"table {key!r}: row {r!r} has {len(r)} cells, expected {len(columns)}")
        self._check_open()
        step = self._check_step(step)
        if self._text_file is None:
            self._text_file = open(self.run_dir / "text.jsonl", "a", encoding="utf-8")
        record = {"step": step, "time": time.time(), "key": key, "columns": list(columns), "rows": rows}
        self._text_file.write(json.dumps(record, default=str) + "\n")
        self._text_file.flush()
        if self._tb is not None:
            header = "| " + " | ".join(map(str, columns)) + " |\n|" + "---|" * len(columns) + "\n"
            body = "".join("| " + " | ".join(str(c) for c in r) + " |\n" for r in rows)
            self._tb.add_text(key, header + body, step)
        if self._wandb_run is not None:
            import wandb

            self._wandb_run.log({key: wandb.Table(columns=list(columns), data=rows)}, step=step)

    def close(self) -> None:
        """Flush and close every backend (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._metrics_file.close()
        if self._text_file is not None:
            self._text_file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb_run is not None:
            self._wandb_run.finish()

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _escape_html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _metrics_file(path: str | os.PathLike) -> pathlib.Path:
    path = pathlib.Path(path)
    return path / "metrics.jsonl" if path.is_dir() else path


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl`` (or of a run dir), non-finite strings back as floats.

    A torn last line (the process died mid-write) is skipped; a bad line elsewhere raises.
    """
    file = _metrics_file(path)
    lines = file.read_text(encoding="utf-8").splitlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                break  # torn final line
            raise ValueError(f"{file}:{number}: not a JSON line: {err}") from None
        rows.append({k: _NON_FINITE_TEXT.get(v, v) if isinstance(v, str) else v for k, v in row.items()})
    return rows


def rewind_metrics(path: str | os.PathLike, step: int, saved_at: float | None = None) -> int:
    """Drop the rows a resumed run will log again; return how many were dropped.

    ``step`` is the resumed checkpoint's step and ``saved_at`` its save time
    (``time.time()``). A row goes when its step is later than ``step``, or equal to it
    and logged after ``saved_at`` (e.g. an evaluation that ran right after the save).
    Kept rows stay byte for byte. A missing file is fine (0). When the dropped rows are
    the file's tail, the file is truncated in place, so a logger holding it open in
    append mode keeps working; otherwise it is rewritten atomically.
    """
    file = _metrics_file(path)
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        return 0
    lines = data.splitlines(keepends=True)
    keep: list[bool] = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:  # a torn line: it was being written when the run died
            keep.append(False)
            continue
        row_step, row_time = row.get("step"), row.get("time")
        later = isinstance(row_step, int) and (
            row_step > step
            or (
                row_step == step and saved_at is not None and isinstance(row_time, (int, float)) and row_time > saved_at
            )
        )
        keep.append(not later)
    dropped = keep.count(False)
    if not dropped:
        return 0
    first_dropped = keep.index(False)
    if not any(keep[first_dropped:]):
        with open(file, "r+b") as handle:
            handle.truncate(sum(len(line) for line in lines[:first_dropped]))
            handle.flush()
            os.fsync(handle.fileno())
        return dropped
    tmp = file.with_name(file.name + ".rewind")
    with open(tmp, "wb") as handle:
        handle.writelines(line for line, k in zip(lines, keep, strict=True) if k)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, file)
    return dropped


def _agg_figure(name: str, size: tuple[float, float]) -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(
            f"{name} needs matplotlib, which is not installed; install it with: pip install 'comlrl-gym[viz]'"
        ) from None
    fig = Figure(figsize=size, dpi=100)  # Figure + Agg canvas: no pyplot global state, no display
    FigureCanvasAgg(fig)
    return fig


def trailing_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of each value and the ``window - 1`` before it (fewer at the start)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    return [
        math.fsum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))
    ]


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [p[0] for p in points], [p[1] for p in points]


def plot_training_reward(
    path: str | os.PathLike,
    reward_key: str,
    level_keys: Sequence[str],
    out_png: str | os.PathLike,
    *,
    window: int = 5,
    title: str | None = None,
) -> pathlib.Path:
    """Training reward per step from a metrics file: ``reward_key`` raw and as a trailing mean
    over ``window`` steps (top), and each of ``level_keys`` (e.g. the env's reward levels)
    raw per step (bottom). Keys that were never logged are left out; needs matplotlib."""
    rows = read_metrics(path)
    steps, reward = _series(rows, reward_key)
    if not steps:
        raise KeyError(f"metric {reward_key!r} not in {_metrics_file(path)}")
    fig = _agg_figure("plot_training_reward", (7, 6))
    top, bottom = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2)
    top.plot(steps, reward, alpha=0.4, marker=".", label=f"{reward_key} (raw)")
    top.plot(steps, trailing_mean(reward, window), linewidth=2, label=f"trailing mean of {window} steps")
    top.set_ylabel("team reward")
    top.set_title(title or f"training reward ({reward_key})")
    top.legend(fontsize=8)
    for key in level_keys:
        xs, ys = _series(rows, key)
        if xs:
            bottom.plot(xs, ys, marker=".", label=key)
    bottom.set_xlabel("step")
    bottom.set_ylabel("reward level (0-1)")
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(fontsize=8)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    out = pathlib.Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def plot_before_after(
    rows: Mapping[str, Mapping[str, float]], out_png: str | os.PathLike, *, title: str | None = None
) -> pathlib.Path:
    """Per metric (``rows[name]`` with ``before``, ``after``, ``difference``, ``low``, ``high``):
    before / after bars (left) and the difference with its interval as error bars (right)."""
    if not rows:
        raise ValueError("plot_before_after needs at least one metric")
    names = list(rows)
    xs = list(range(len(names)))
    fig = _agg_figure("plot_before_after", (max(7.0, 1.4 * len(names) + 3), 4.5))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    width = 0.38
    left.bar([x - width / 2 for x in xs], [rows[n]["before"] for n in names], width, label="before training")
    left.bar([x + width / 2 for x in xs], [rows[n]["after"] for n in names], width, label="after training")
    left.set_xticks(xs, names, rotation=35, ha="right", fontsize=8)
    left.set_title("held-out metrics")
    left.legend(fontsize=8)
    diffs = [rows[n]["difference"] for n in names]
    errors = [
        [d - rows[n]["low"] for n, d in zip(names, diffs, strict=True)],
        [rows[n]["high"] - d for n, d in zip(names, diffs, strict=True)],
    ]
    right.errorbar(xs, diffs, yerr=errors, fmt="o", capsize=4)
    right.axhline(0.0, color="grey", linewidth=1)
    right.set_xticks(xs, names, rotation=35, ha="right", fontsize=8)
    right.set_title("after - before, 95% interval")
    for ax in (left, right):
        ax.grid(True, axis="y", alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = pathlib.Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def plot_metric(
    path: str | os.PathLike,
    key: str | Sequence[str],
    out_png: str | os.PathLike,
    *,
    title: str | None = None,
) -> pathlib.Path:
    """Draw metric(s) ``key`` against step from a metrics file into ``out_png``.

    Needs matplotlib (``pip install 'comlrl-gym[viz]'``). Non-finite points are left out.
    """
    keys = [key] if isinstance(key, str) else list(key)
    rows = read_metrics(path)
    available = sorted({k for row in rows for k in row if k not in _RESERVED})
    missing = [k for k in keys if k not in available]
    if missing:
        raise KeyError(f"metric(s) {missing} not in {_metrics_file(path)}; available: {', '.join(available)}")
    fig = _agg_figure("plot_metric", (6, 4))
    ax = fig.add_subplot(1, 1, 1)
    for k in keys:
        points = [
            (row["step"], row[k])
            for row in rows
            if k in row and isinstance(row[k], (int, float)) and math.isfinite(row[k])
        ]
        ax.plot([p[0] for p in points], [p[1] for p in points], label=k)
    ax.set_xlabel("step")
    ax.set_title(title or ", ".join(keys))
    if len(keys) > 1:
        ax.legend()
    ax.grid(True, alpha=0.3)
    out = pathlib.Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out
