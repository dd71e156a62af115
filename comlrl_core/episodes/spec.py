"""EvalSpec: everything that decides an evaluation's numbers, saved with every run.

Trainers write their evaluation settings (and their team's agent specs) to
``RUN_DIR/evaluation.json`` when they first evaluate; ``comlrl eval --checkpoint RUN_DIR``
reads it back, so it replays exactly the evaluation the run logged. ``spec.to_dict()`` /
``EvalSpec.from_dict`` round-trip through JSON.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from comlrl_core.policy import GenerationConfig

__all__ = ["EVALUATION_FILE", "EvalSpec", "read_run_evaluation", "write_run_evaluation"]

EVALUATION_FILE = "evaluation.json"
_FORMAT = 1


@dataclass(frozen=True)
class EvalSpec:
    """An evaluation: ``episodes_per_task`` episodes of each of the first ``num_tasks`` tasks
    (None: all) of ``make(env, **env_kwargs)`` (``task_slice`` there selects the split).

    ``max_turns`` caps an episode (None: the env ends it); ``discount`` weighs
    ``return_mean``; ``k`` lists the pass@k values (those above ``episodes_per_task``
    are not reported); ``seed`` is the evaluation seed (see ``comlrl_core.episodes.seeds``).
    """

    env: str
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    num_tasks: int | None = None
    episodes_per_task: int = 1
    max_turns: int | None = None
    discount: float = 1.0
    k: tuple[int, ...] = (1,)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.env, str) or not self.env:
            raise ValueError(f"EvalSpec.env must be a registered environment id, got {self.env!r}")
        object.__setattr__(self, "env_kwargs", dict(self.env_kwargs))
        if self.num_tasks is not None and (isinstance(self.num_tasks, bool) or int(self.num_tasks) < 1):
            raise ValueError(f"EvalSpec.num_tasks must be >= 1 or None (all tasks), got {self.num_tasks!r}")
        if isinstance(self.episodes_per_task, bool) or int(self.episodes_per_task) < 1:
            raise ValueError(f"EvalSpec.episodes_per_task must be >= 1, got {self.episodes_per_task!r}")
        if self.max_turns is not None and int(self.max_turns) < 1:
            raise ValueError(f"EvalSpec.max_turns must be >= 1 or None (the env decides), got {self.max_turns!r}")
        if not 0.0 <= float(self.discount) <= 1.0:
            raise ValueError(f"EvalSpec.discount must be in [0, 1], got {self.discount!r}")
        ks = (self.k,) if isinstance(self.k, int) else tuple(self.k)
        if not ks or any(int(x) < 1 for x in ks):
            raise ValueError(f"EvalSpec.k must hold pass@k values >= 1, got {self.k!r}")
        object.__setattr__(self, "k", tuple(sorted({int(x) for x in ks})))
        if isinstance(self.generation, Mapping):
            object.__setattr__(self, "generation", GenerationConfig(**self.generation))
        if not isinstance(self.generation, GenerationConfig):
            raise ValueError(f"EvalSpec.generation must be a GenerationConfig, got {type(self.generation).__name__}")

    def replace(self, **changes: Any) -> "EvalSpec":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "env_kwargs": dict(self.env_kwargs),
            "num_tasks": self.num_tasks,
            "episodes_per_task": self.episodes_per_task,
            "max_turns": self.max_turns,
            "discount": self.discount,
            "k": list(self.k),
            "generation": dataclasses.asdict(self.generation),
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EvalSpec":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown EvalSpec field(s) {unknown}; known: {sorted(known)}")
        return cls(**dict(data))


def write_run_evaluation(
    run_dir: str | os.PathLike, spec: EvalSpec, agents: Sequence[Mapping[str, Any] | None], prefix: str = "eval/"
) -> pathlib.Path:
    """Save ``spec``, the team's agent specs (one dict per agent, None for an agent that
    cannot be rebuilt from a spec) and the metric prefix to ``run_dir/evaluation.json``."""
    path = pathlib.Path(run_dir) / EVALUATION_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {"format": _FORMAT, "spec": spec.to_dict(), "agents": list(agents), "prefix": prefix}
    unsaved = [key for key, value in spec.env_kwargs.items() if not _is_json(value)]
    if unsaved:  # e.g. formatter functions: the file says why the run cannot be replayed
        payload["not_replayable"] = f"env_kwargs {unsaved} hold Python objects that a file cannot keep"
        payload["spec"]["env_kwargs"] = {k: v for k, v in spec.env_kwargs.items() if k not in unsaved}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def read_run_evaluation(run_dir: str | os.PathLike) -> tuple[EvalSpec, list[dict[str, Any] | None], str]:
    """``(spec, agent specs, metric prefix)`` saved in ``run_dir/evaluation.json``."""
    path = pathlib.Path(run_dir) / EVALUATION_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: the run never evaluated (eval_interval=0?) or predates evaluation.json; "
            "give the evaluation settings as options instead (--env, --model, ...)"
        )
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != _FORMAT:
        raise ValueError(f"{path} has format {data.get('format')!r}; this version reads format {_FORMAT}")
    if data.get("not_replayable"):
        raise ValueError(f"{path}: the run's evaluation cannot be replayed: {data['not_replayable']}")
    return EvalSpec.from_dict(data["spec"]), list(data["agents"]), str(data.get("prefix", "eval/"))
