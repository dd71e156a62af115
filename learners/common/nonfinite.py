"""Halt a run whose weights or optimizer state went NaN/Inf.

``skip_nonfinite`` handles one bad loss (the update is skipped, nothing changes). This
guards the other case: an update that went through and left non-finite parameters or
AdamW moments (e.g. a learning rate far too large). Training on would only write NaN
checkpoints over good ones, so the run stops with :class:`NonFiniteTrainingError`,
naming the step, the optimizer and the last good checkpoint.
"""

from __future__ import annotations

import pathlib
from typing import Any, Mapping

from comlrl_core.run.checkpoint import find_nonfinite_state, latest_checkpoint

__all__ = ["NonFiniteGuard", "NonFiniteTrainingError", "halt_if_nonfinite"]


class NonFiniteTrainingError(RuntimeError):
    """Parameters or optimizer state became NaN/Inf after a training step."""


def halt_if_nonfinite(optimizers: Mapping[str, Any], step: int, checkpoint_root: pathlib.Path) -> None:
    """Raise :class:`NonFiniteTrainingError` when any optimizer holds NaN/Inf after ``step``."""
    problem = find_nonfinite_state(optimizers)
    if problem is None:
        return
    last = latest_checkpoint(checkpoint_root, verify_hashes=False)
    kept = f"the last good checkpoint is {last} (resume it with --resume)" if last else "no checkpoint was saved"
    raise NonFiniteTrainingError(
        f"training halted after step {step}: {problem}; {kept}. "
        "Lower the learning rate or set max_grad_norm, then run again"
    )


class NonFiniteGuard:
    """:func:`halt_if_nonfinite` after a step, skipped when no optimizer stepped since the
    last check (e.g. MAGRPO steps that only fill a rollout buffer): the weights and moments
    can only have changed through an optimizer step."""

    def __init__(self) -> None:
        self._seen: tuple[Any, ...] | None = None

    def check(self, optimizers: Mapping[str, Any], step: int, checkpoint_root: pathlib.Path) -> None:
        counts = tuple(_step_count(opt) for opt in optimizers.values())
        if counts == self._seen:
            return
        halt_if_nonfinite(optimizers, step, checkpoint_root)
        self._seen = counts


def _step_count(opt: Any) -> Any:
    """The optimizer's step counter (AdamW keeps one per parameter), or None before its first step."""
    state = getattr(opt, "state", None) or {}
    first = next(iter(state.values()), None) if isinstance(state, Mapping) else None
    count = first.get("step") if isinstance(first, Mapping) else None
    return float(count) if count is not None else None
