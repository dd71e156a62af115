"""Llama-family MLPs that keep less for the backward pass.

Such an MLP computes ``down(silu(gate(x)) * up(x))``. For the backward pass autograd keeps,
per token and layer, ``gate(x)`` (silu's input), ``silu(gate(x))`` and ``up(x)`` (the
product's operands), and the product itself when ``down`` trains (LoRA's ``A`` or the full
weight): four vectors of the intermediate width, the largest saved tensors of a training
forward (SmolLM2-135M: 4 x 1536 of the ~11k floats a token keeps per layer). :class:`SiluMul`
keeps ``gate(x)`` and ``up(x)`` only and recomputes ``silu`` in its backward: a few
elementwise operations per element, beside GEMMs that cost hundreds. The values are the
same operations in the same order as transformers' forward, so results are identical.

:func:`use_lean_swiglu` switches a model's MLPs to it (instance-level ``forward``; passes
without gradients run the stock arithmetic). Only MLPs of the exact shape above are
touched: ``gate_proj``, ``up_proj``, ``down_proj`` and a SiLU ``act_fn``.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

_MARK = "_comlrl_lean_swiglu"


class SiluMul(torch.autograd.Function):
    """``silu(gate) * up``, saving ``gate`` and ``up`` only."""

    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        gate, up = ctx.saved_tensors
        grad_gate = grad_up = None
        if ctx.needs_input_grad[1]:
            grad_up = grad * F.silu(gate)
        if ctx.needs_input_grad[0]:  # autograd's own fused kernel for silu's derivative
            grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        return grad_gate, grad_up


def _lean_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    gate, up = self.gate_proj(x), self.up_proj(x)
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        return self.down_proj(SiluMul.apply(gate, up))
    return self.down_proj(self.act_fn(gate) * up)


def _is_silu(act: Any) -> bool:
    # transformers' ACT2FN["silu"] is its own SiLUActivation (F.silu), not nn.SiLU
    return isinstance(act, nn.SiLU) or type(act).__name__ == "SiLUActivation"


def _is_swiglu(module: nn.Module) -> bool:
    return (
        all(isinstance(getattr(module, name, None), nn.Module) for name in ("gate_proj", "up_proj", "down_proj"))
        and _is_silu(getattr(module, "act_fn", None))
        and "forward" not in module.__dict__  # someone else's replacement (hooks, offloading): left alone
    )


def has_lean_swiglu(module: nn.Module) -> bool:
    """Whether ``module``'s instance-level ``forward`` is the one :func:`use_lean_swiglu`
    installed (the stock arithmetic position by position, nobody else's wrapper)."""
    forward = module.__dict__.get("forward")
    return isinstance(forward, types.MethodType) and forward.__func__ is _lean_forward and forward.__self__ is module


def use_lean_swiglu(model: nn.Module) -> int:
    """Switch every SwiGLU MLP of ``model`` to :class:`SiluMul`; returns how many (again
    on the same model: 0)."""
    switched = 0
    for module in model.modules():
        if _is_swiglu(module) and not getattr(module, _MARK, False):
            module.forward = types.MethodType(_lean_forward, module)
            setattr(module, _MARK, True)
            switched += 1
    return switched
