"""Rebuild a trained run's team from its folder: agent specs + the latest checkpoint.

``load_run_team(run_dir)`` reads the agent specs a trainer saved in
``run_dir/evaluation.json`` (see :mod:`comlrl_core.episodes.spec`), builds the team with
``Team.from_specs`` (LoRA agents on one shared base, as in training) and loads every
agent's saved weights -- its adapter, or its full weights -- from the latest complete
checkpoint under ``run_dir/checkpoints`` (or the one given).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Mapping, Sequence

from comlrl_core.policy import Policy
from comlrl_core.run.checkpoint import latest_checkpoint, load_checkpoint

__all__ = ["agent_spec_dicts", "load_run_team"]


def agent_spec_dicts(policies: Sequence[Policy]) -> list[dict[str, Any] | None]:
    """Each policy's AgentSpec as a dict (None for a policy built without one)."""
    out: list[dict[str, Any] | None] = []
    for policy in policies:
        spec = getattr(policy, "spec", None)
        # a dataclass instance (is_dataclass is true for the class too)
        out.append(dataclasses.asdict(spec) if dataclasses.is_dataclass(spec) and not isinstance(spec, type) else None)
    return out


def load_run_team(
    run_dir: str | os.PathLike,
    agents: Sequence[Mapping[str, Any] | None],
    checkpoint: str | os.PathLike | None = None,
) -> tuple[Any, pathlib.Path]:
    """``(team, checkpoint folder)``: the team of ``agents`` with the checkpoint's weights."""
    from comlrl_core.models.team import AgentSpec, Team  # heavy (torch, transformers)

    run_dir = pathlib.Path(run_dir)
    missing = [i for i, a in enumerate(agents) if a is None]
    if missing:
        raise ValueError(
            f"{run_dir}: agents {missing} were not built from model specs (custom policies), so the run's "
            "team cannot be rebuilt; evaluate it in Python with comlrl_core.episodes.evaluation instead"
        )
    path = pathlib.Path(checkpoint) if checkpoint else latest_checkpoint(run_dir / "checkpoints")
    if path is None:
        raise FileNotFoundError(f"no complete checkpoint under {run_dir / 'checkpoints'} (save_final_checkpoint?)")
    specs = [AgentSpec(**dict(a)) for a in agents if a is not None]
    team = Team.from_specs(specs)
    load_checkpoint(path, policies={f"agent_{i}": p for i, p in enumerate(team)}, restore_rng=False)
    return team, path
