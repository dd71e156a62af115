"""Trainers' evaluation: the episode engine on the evaluation split, logged as ``eval/...``.

Every trainer evaluates through :func:`trainer_evaluation`, which calls
:func:`comlrl_core.episodes.evaluation.evaluate_episodes` (the one engine: batched
generation, per-episode seeds, the metric vocabulary of ``docs/evaluation.md``) with the
trainer's settings, and saves those settings (an
:class:`~comlrl_core.episodes.spec.EvalSpec` plus the team's agent specs) to
``RUN_DIR/evaluation.json`` so that ``comlrl eval --checkpoint RUN_DIR`` replays the
same evaluation and prints the same ``eval/...`` values as the run's last eval row.

Each evaluation also appends one line to ``RUN_DIR/eval_episodes.jsonl``: its episode rows
(:func:`comlrl_core.episodes.metrics.episode_rows`: task, sample, rewards, return, test pass
rate, ...), in the order the evaluations ran, so that two evaluations (e.g. before and after
training) can be compared episode by episode (:mod:`comlrl_core.episodes.intervals`).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Mapping, Sequence

from comlrl_core.episodes.evaluation import evaluate_episodes
from comlrl_core.episodes.run_team import agent_spec_dicts
from comlrl_core.episodes.spec import EvalSpec, write_run_evaluation
from comlrl_core.policy import GenerationConfig, Policy

__all__ = ["EPISODES_FILE", "EVAL_PREFIX", "read_eval_episodes", "trainer_eval_spec", "trainer_evaluation"]

EVAL_PREFIX = "eval/"
EPISODES_FILE = "eval_episodes.jsonl"


def _append_eval_episodes(run_dir: pathlib.Path, rows: list[dict[str, Any]], seed: int) -> pathlib.Path:
    path = pathlib.Path(run_dir) / EPISODES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"seed": seed, "episodes": rows}) + "\n")
    return path


def read_eval_episodes(run_dir: str | pathlib.Path) -> list[list[dict[str, Any]]]:
    """The episode rows of every evaluation of a run, in the order they ran ([] when none)."""
    path = pathlib.Path(run_dir) / EPISODES_FILE
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["episodes"] for line in lines if line.strip()]


def trainer_eval_spec(
    env_spec: Any,
    env_kwargs: Mapping[str, Any] | None,
    *,
    num_tasks: int,
    episodes_per_task: int,
    num_turns: int,
    discount: float,
    k: Sequence[int],
    generation_config: GenerationConfig,
    seed: int,
) -> EvalSpec | None:
    """The EvalSpec of a trainer's evaluation (None when the env is a factory, not a
    registered id, or its constructor arguments are unknown: nothing to replay from)."""
    if not isinstance(env_spec, str) or env_kwargs is None:
        return None
    return EvalSpec(
        env=env_spec,
        env_kwargs={key: value for key, value in env_kwargs.items() if value is not None},
        num_tasks=num_tasks,
        episodes_per_task=episodes_per_task,
        max_turns=num_turns,
        discount=discount,
        k=tuple(k),
        generation=generation_config,
        seed=seed,
    )


def trainer_evaluation(
    env: Any,
    policies: Sequence[Policy],
    *,
    num_tasks: int,
    episodes_per_task: int,
    num_turns: int,
    discount: float,
    k: Sequence[int],
    generation_config: GenerationConfig,
    seed: int,
    env_spec: Any = None,
    env_kwargs: Mapping[str, Any] | None = None,
    run_dir: pathlib.Path | None = None,
) -> dict[str, float]:
    """Evaluate on the first ``num_tasks`` tasks of ``env`` and return ``eval/...`` metrics.

    With ``run_dir`` (and a registered ``env_spec`` with its ``env_kwargs``) the settings
    are saved to ``run_dir/evaluation.json`` first; with ``run_dir`` the episode rows are
    appended to ``run_dir/eval_episodes.jsonl``.
    """
    spec = trainer_eval_spec(
        env_spec,
        env_kwargs,
        num_tasks=num_tasks,
        episodes_per_task=episodes_per_task,
        num_turns=num_turns,
        discount=discount,
        k=k,
        generation_config=generation_config,
        seed=seed,
    )
    if spec is not None and run_dir is not None:
        write_run_evaluation(run_dir, spec, agent_spec_dicts(policies), EVAL_PREFIX)
    result = evaluate_episodes(
        env,
        list(policies),
        num_tasks=num_tasks,
        episodes_per_task=episodes_per_task,
        generation_config=generation_config,
        seed=seed,
        discount=discount,
        k=k,
        max_turns=num_turns,
        prefix=EVAL_PREFIX,
    )
    if run_dir is not None:
        _append_eval_episodes(run_dir, result.episode_rows(), seed)
    return result.metrics
