"""The AdamW every learner uses: PyTorch's fused kernel when the parameters allow it.

The fused implementation updates all tensors in one kernel per step instead of a chain of
element-wise ops per tensor: on a 135M-parameter model about 5x faster per step on CPU,
with no extra buffers (the ``foreach`` variant stacks temporaries as big as the model).
Same algorithm and hyper-parameters as ``torch.optim.AdamW``.

Every optimizer made here also carries what the trainers log and schedule (TRL's names):

* ``grad_norm``: a hook before each ``step()`` measures the gradient norm (or takes the
  pre-clipping norm an update noted with :func:`note_grad_norm`);
  :func:`drain_optimizer_stats` returns the mean since the last call.
* the learning-rate schedule: :class:`LearningRateSchedule` sets each param group's rate
  to ``initial_lr * factor(step)``, ``factor`` from ``transformers.get_scheduler``
  (``lr_scheduler_type``, ``warmup_steps`` / ``warmup_ratio``). The step is the trainer's
  global step, so a resumed run gets its rate back from the step alone.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping

import torch

from learners.common.options import SCHEDULER_TYPES

__all__ = [
    "SCHEDULER_TYPES",
    "LearningRateSchedule",
    "adamw",
    "adamw_settings",
    "drain_optimizer_stats",
    "note_grad_norm",
    "schedule_factor",
    "warmup_steps_of",
]

_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _fusable(params: list[torch.nn.Parameter]) -> bool:
    return all(p.device.type in ("cpu", "cuda") and p.dtype in _FUSED_DTYPES and not p.is_sparse for p in params)


def adamw(
    params: Iterable[torch.nn.Parameter],
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> torch.optim.AdamW:
    """``torch.optim.AdamW(params, lr, betas, eps, weight_decay)``, fused when every parameter
    supports it, with the grad-norm hook (see the module doc)."""
    params = list(params)
    kwargs: dict[str, Any] = {"lr": lr, "weight_decay": weight_decay, "betas": betas, "eps": eps}
    optimizer: torch.optim.AdamW | None = None
    if params and _fusable(params):
        try:
            optimizer = torch.optim.AdamW(params, **kwargs, fused=True)
        except (RuntimeError, ValueError):  # a build without the fused kernel for this device
            pass
    if optimizer is None:
        optimizer = torch.optim.AdamW(params, **kwargs, foreach=False)
    optimizer.register_step_pre_hook(_measure_grad_norm)
    return optimizer


def adamw_settings(config: Any) -> dict[str, Any]:
    """The AdamW keyword arguments of a learner config (weight decay, betas, epsilon)."""
    return {
        "weight_decay": config.weight_decay,
        "betas": (getattr(config, "adam_beta1", 0.9), getattr(config, "adam_beta2", 0.999)),
        "eps": getattr(config, "adam_epsilon", 1e-8),
    }


# -- gradient norm ----------------------------------------------------------------------
_NORMS = "_comlrl_grad_norms"  # attribute on the optimizer: norms of the steps since the last drain
_NOTED = "_comlrl_noted_grad_norm"


def note_grad_norm(optimizer: torch.optim.Optimizer, norm: float | torch.Tensor) -> None:
    """Record the gradient norm before clipping (``clip_grad_norm_``'s result) for the next
    step: that is the one TRL logs, the hook would otherwise see the clipped gradients."""
    setattr(optimizer, _NOTED, float(norm))


def _measure_grad_norm(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    norm = optimizer.__dict__.pop(_NOTED, None)
    if norm is None:
        grads = [p.grad.detach() for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))
    optimizer.__dict__.setdefault(_NORMS, []).append(norm)


def drain_optimizer_stats(optimizers: Mapping[str, torch.optim.Optimizer]) -> dict[str, float]:
    """``<name>/learning_rate`` (current, first param group) and ``<name>/grad_norm`` (mean
    over the steps since the last drain; absent when none stepped) of each optimizer."""
    out: dict[str, float] = {}
    for name, optimizer in optimizers.items():
        if not optimizer.param_groups:
            continue
        out[f"{name}/learning_rate"] = float(optimizer.param_groups[0]["lr"])
        norms = optimizer.__dict__.pop(_NORMS, None)
        if norms:
            out[f"{name}/grad_norm"] = sum(norms) / len(norms)
    return out


# -- learning-rate schedule ---------------------------------------------------------------
_NEEDS_TOTAL = ("linear", "cosine", "cosine_with_restarts", "polynomial", "cosine_with_min_lr")


def warmup_steps_of(config: Any, total_steps: int | None) -> int:
    """``warmup_steps`` when set (> 0), else ``ceil(warmup_ratio * total_steps)`` (TRL's rule)."""
    steps = int(getattr(config, "warmup_steps", 0) or 0)
    if steps > 0:
        return steps
    ratio = float(getattr(config, "warmup_ratio", 0.0) or 0.0)
    return math.ceil(ratio * total_steps) if ratio and total_steps else 0


def schedule_factor(config: Any, total_steps: int | None) -> Callable[[int], float]:
    """``step -> learning-rate multiplier`` of the config's schedule (``get_scheduler``'s)."""
    name = getattr(config, "lr_scheduler_type", "constant") or "constant"
    warmup = warmup_steps_of(config, total_steps)
    if name == "constant" and warmup == 0:
        return lambda step: 1.0
    if name == "constant" and warmup > 0:  # TRL: warm-up turns a constant schedule into this one
        name = "constant_with_warmup"
    if name in _NEEDS_TOTAL and not total_steps:
        raise ValueError(
            f"lr_scheduler_type={name!r} needs the run's number of steps, which this trainer does not know "
            "in advance; use constant or constant_with_warmup"
        )
    from transformers import get_scheduler

    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)  # only its lambda is used
    kwargs: dict[str, Any] = {}
    if name == "cosine_with_min_lr":
        kwargs["scheduler_specific_kwargs"] = {"min_lr_rate": 0.1}
    scheduler: Any = get_scheduler(name, probe, num_warmup_steps=warmup, num_training_steps=total_steps or 1, **kwargs)
    return scheduler.lr_lambdas[0]


class LearningRateSchedule:
    """Sets every param group's rate to ``initial_lr * factor(step)`` (see the module doc)."""

    def __init__(self, optimizers: Iterable[torch.optim.Optimizer], config: Any, total_steps: int | None) -> None:
        self.optimizers = list(optimizers)
        self.factor = schedule_factor(config, total_steps)
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])  # saved with the optimizer state

    def apply(self, step: int) -> None:
        scale = float(self.factor(step))
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = group["initial_lr"] * scale
