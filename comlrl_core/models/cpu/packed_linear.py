"""Pre-packed linear weights for CPU decoding.

A decoding step multiplies a few rows (the batch) by every weight matrix of the model.
At that size the CPU GEMM libraries spend much of their time re-arranging the weight
into their blocked layout on every call. Packing each weight once per generation call
and reusing the packed copy for every step halves the matrix time on SmolLM2-135M (bf16
through oneDNN, fp32 through MKL's packed GEMM).

:func:`prepacked_linears` is a context manager that does this for the plain ``nn.Linear``
layers of a model while it is active (no-grad passes only; anything with gradients runs the
plain layer): every one in bf16, in fp32 only the weights of at least
``FP32_MIN_WEIGHT_ELEMENTS`` (the vocabulary projection; MKL's packed copies of all the
layers cost more memory than the model itself for a smaller part of the gain). The results
are those of the plain layers: the same oneDNN bf16 kernel family that autocast calls, and
fp32 GEMM up to summation order.

The packing ops are private (``torch.ops.mkldnn`` / ``torch.ops.mkl``), so each dtype's
path is probed once per process: a small layer packed and compared with ``F.linear``.
Where a probe fails (ops missing or changed, no MKL / oneDNN, not on CPU) the layers stay
plain and one log line says why; a packing error on a real model switches the path off
the same way. Layers whose ``forward`` is already replaced on the instance (accelerate's
hooks: offloading, device maps) are never touched.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Iterator, TypeGuard

import torch
from torch import nn

logger = logging.getLogger(__name__)

# Weights smaller than this gain nothing from packing (LoRA adapters, tiny test models
# still pack: the threshold only skips the trivially small).
_MIN_WEIGHT_ELEMENTS = 4096

# fp32 (MKL) packing only for weights at least this large: the vocabulary projection of a
# small model, not the transformer layers. Measured on SmolLM2-135M (Xeon, 1 thread, linear
# time of one decoding step, plain -> packed): the lm_head (576 x 49152) takes 61 -> 26 ms
# at 16 rows and 80 -> 43 ms at 48 for 108 MiB packed; all 210 layer weights together take
# 38 -> 24 ms and 76 -> 61 ms for another ~415 MiB. Packing everything raised the RSS of a
# sampling call by 1.02 GiB (more than the fp32 model): most of the speed for a fifth of it.
FP32_MIN_WEIGHT_ELEMENTS = 1 << 22

# dtypes whose packing failed on a real model in this process (probes passed, a layer did not)
_broken: set[torch.dtype] = set()


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
        if self.compute_dtype in _broken or (
            torch.is_grad_enabled() and (x.requires_grad or self.layer.weight.requires_grad)
        ):
            return self.original(x)
        try:
            return self._packed_call(x)
        except Exception as exc:  # noqa: BLE001 - private ops: this call and the rest go plain
            _switch_off(self.compute_dtype, exc)
            return self.original(x)

    def _packed_call(self, x: torch.Tensor) -> torch.Tensor:
        if self.compute_dtype == torch.bfloat16:
            return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), self.packed, self.bias, "none", [], "")
        rows = x.numel() // x.shape[-1]
        if x.dtype != torch.float32 or rows != self.rows:  # MKL's packing is for one row count
            return self.original(x)
        out = torch.ops.mkl._mkl_linear(x.reshape(rows, -1), self.packed, self.weight, self.bias, rows)
        return out.reshape(*x.shape[:-1], out.shape[-1])


def _switch_off(dtype: torch.dtype, exc: Exception) -> None:
    """A packing op failed on a real model: plain layers for ``dtype`` from now on."""
    if dtype not in _broken:
        _broken.add(dtype)
        logger.warning(
            "pre-packed %s linear weights are off from now on, decoding uses the plain layers: %s: %s",
            str(dtype).removeprefix("torch."),
            type(exc).__name__,
            exc,
        )


def _probe(dtype: torch.dtype) -> str | None:
    """Pack a small layer for ``dtype`` and compare with ``F.linear``; None when they agree."""
    if dtype == torch.bfloat16:
        if not torch.backends.mkldnn.is_available():
            return "this torch build has no oneDNN"
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return "this CPU has no oneDNN bf16 support"
    elif not getattr(torch._C, "has_mkl", False):
        return "this torch build has no MKL"
    gen = torch.Generator().manual_seed(0)
    layer = nn.Linear(64, 48)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(48, 64, generator=gen) / 8)
        layer.bias.copy_(torch.randn(48, generator=gen))
        x = torch.randn(3, 64, generator=gen)
        packed = _PackedForward(layer, dtype, rows=3)._packed_call(x.to(dtype)).float()
        plain = nn.functional.linear(x.to(dtype), layer.weight.to(dtype), layer.bias.to(dtype)).float()
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    if packed.shape != plain.shape:
        return f"packed output shape {tuple(packed.shape)} differs from F.linear's {tuple(plain.shape)}"
    if not torch.allclose(packed, plain, atol=tolerance, rtol=tolerance):
        return f"packed results differ from F.linear by up to {(packed - plain).abs().max().item():.3g}"
    return None


@functools.cache
def unavailable_reason(dtype: torch.dtype) -> str | None:
    """None when packing for ``dtype`` works in this process, else why not (probed once,
    logged once)."""
    try:
        with torch.autocast("cpu", enabled=False):  # the probe picks its dtype itself
            reason = _probe(dtype)
    except Exception as exc:  # noqa: BLE001 - private ops: any failure means plain layers
        reason = f"{type(exc).__name__}: {exc}"
    if reason is not None:
        name = str(dtype).removeprefix("torch.")
        logger.info("pre-packed %s linear weights are off, decoding uses the plain layers: %s", name, reason)
    return reason


def _bf16_packing_available() -> bool:
    return torch.bfloat16 not in _broken and unavailable_reason(torch.bfloat16) is None


def _fp32_packing_available() -> bool:
    return torch.float32 not in _broken and unavailable_reason(torch.float32) is None


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


def _packable(module: nn.Module, dtype: torch.dtype) -> TypeGuard[nn.Linear]:
    min_elements = FP32_MIN_WEIGHT_ELEMENTS if dtype == torch.float32 else _MIN_WEIGHT_ELEMENTS
    return (
        type(module) is nn.Linear
        # an instance-level forward is someone else's wrapper (accelerate's hook moves
        # offloaded weights in before calling the layer): replacing it would drop it
        and "forward" not in module.__dict__
        and not hasattr(module, "_hf_hook")
        and module.weight.device.type == "cpu"
        and module.weight.numel() >= min_elements
        and module.weight.dtype in (torch.float32, torch.bfloat16)
    )


# Packing a weight costs a pass over it (the SmolLM2 lm_head: ~157 ms on 2 cores, once per
# sampling call) and gains per decoding step only from a few rows on (1 row: none, packed
# was slower; 16 rows: ~3.7 ms a step). Below these, a call keeps the plain layers.
MIN_PACKED_ROWS = 4
MIN_PACKED_ROW_TOKENS = 1024  # rows x new tokens of the call


def packing_pays(rows: int, new_tokens: int) -> bool:
    """Whether packing for a call of ``rows`` rows decoding ``new_tokens`` tokens each can
    win back its one-off cost."""
    return rows >= MIN_PACKED_ROWS and rows * new_tokens >= MIN_PACKED_ROW_TOKENS


@contextlib.contextmanager
def prepacked_linears(model: nn.Module, rows: int, new_tokens: int | None = None) -> Iterator[bool]:
    """Within the block, no-grad calls of ``model``'s linear layers use weights packed for
    ``rows`` input rows (the decoding batch). Yields whether packing is active. Call it
    inside the autocast region the passes run in (it decides the packing dtype).
    ``new_tokens`` (tokens each row will decode): pack only where :func:`packing_pays`."""
    dtype = packing_dtype(model)
    if new_tokens is not None and not packing_pays(rows, new_tokens):
        dtype = None
    patched: list[nn.Linear] = []
    try:
        if dtype is not None:
            try:
                for module in model.modules():
                    if _packable(module, dtype):
                        # an instance-level forward shadows nn.Linear.forward for this layer only
                        module.__dict__["forward"] = _PackedForward(module, dtype, rows)
                        patched.append(module)
            except Exception as exc:  # noqa: BLE001 - private ops: fall back to the plain layers
                _switch_off(dtype, exc)
                for module in patched:
                    del module.forward
                patched = []
        yield bool(patched)
    finally:
        for module in patched:
            del module.forward  # back to the class's forward
