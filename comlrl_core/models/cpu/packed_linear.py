"""Pre-packed linear weights for CPU decoding.

A decoding step multiplies a few rows (the batch) by every weight matrix of the model.
At that size the CPU GEMM libraries spend much of their time re-arranging the weight
into their blocked layout on every call. Packing each weight once per generation call
and reusing the packed copy for every step halves the matrix time on SmolLM2-135M (bf16
through oneDNN, fp32 through MKL's packed GEMM).

:func:`prepacked_linears` is a context manager that does this for every ``nn.Linear`` of
a model while it is active (no-grad passes only; anything with gradients runs the plain
layer). The results are those of the plain layers: the same oneDNN bf16 kernel family
that autocast calls, and fp32 GEMM up to summation order. Where the backends are missing
(no MKL / oneDNN, not on CPU) it changes nothing.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

# Weights smaller than this gain nothing from packing (LoRA adapters, tiny test models
# still pack: the threshold only skips the trivially small).
_MIN_WEIGHT_ELEMENTS = 4096


def _bf16_packing_available() -> bool:
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _fp32_packing_available() -> bool:
    return bool(getattr(torch._C, "has_mkl", False)) and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")


class _PackedForward:
    """Replacement ``forward`` of one linear layer while packing is active."""

    def __init__(self, layer: nn.Linear, compute_dtype: torch.dtype, rows: int) -> None:
        self.layer, self.original = layer, layer.forward
        self.compute_dtype, self.rows = compute_dtype, rows
        weight = layer.weight.detach()
        bias = layer.bias.detach() if layer.bias is not None else None
        if compute_dtype == torch.bfloat16:
            self.bias = bias.to(torch.bfloat16) if bias is not None else None
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16), rows)
            self.weight = None
        else:
            self.bias, self.weight = bias, weight
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (x.requires_grad or self.layer.weight.requires_grad):
            return self.original(x)
        if self.compute_dtype == torch.bfloat16:
            return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), self.packed, self.bias, "none", [], "")
        rows = x.numel() // x.shape[-1]
        if x.dtype != torch.float32 or rows != self.rows:  # MKL's packing is for one row count
            return self.original(x)
        out = torch.ops.mkl._mkl_linear(x.reshape(rows, -1), self.packed, self.weight, self.bias, rows)
        return out.reshape(*x.shape[:-1], out.shape[-1])


def packing_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype :func:`prepacked_linears` would pack ``model``'s layers in here (bf16 under
    CPU bf16 autocast or for bf16 weights, fp32 for fp32 weights), or None."""
    try:
        param = next(model.parameters())
    except StopIteration:
        return None
    if param.device.type != "cpu":
        return None
    if param.dtype == torch.bfloat16 or (
        torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    ):
        return torch.bfloat16 if _bf16_packing_available() else None
    if param.dtype == torch.float32 and not torch.is_autocast_enabled("cpu"):
        return torch.float32 if _fp32_packing_available() else None
    return None


@contextlib.contextmanager
def prepacked_linears(model: nn.Module, rows: int) -> Iterator[bool]:
    """Within the block, no-grad calls of ``model``'s linear layers use weights packed for
    ``rows`` input rows (the decoding batch). Yields whether packing is active. Call it
    inside the autocast region the passes run in (it decides the packing dtype)."""
    dtype = packing_dtype(model)
    patched: list[nn.Linear] = []
    try:
        if dtype is not None:
            for module in model.modules():
                if (
                    type(module) is nn.Linear
                    and module.weight.numel() >= _MIN_WEIGHT_ELEMENTS
                    and module.weight.dtype in (torch.float32, torch.bfloat16)
                ):
                    module.forward = _PackedForward(module, dtype, rows)
                    patched.append(module)
        yield bool(patched)
    finally:
        for module in patched:
            del module.forward  # back to the class's forward
