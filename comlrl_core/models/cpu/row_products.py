"""Products of one to three rows with a plain fp32 weight, in a small compiled kernel.

At one to three rows a linear layer's product is a pass over its weight: the time is the
weight's bytes over the memory rate. A decoding step at batch 1 reads all of SmolLM2-135M's
538 MB that way. oneDNN's packed kernels and MKL's ``F.linear`` read them well below that
rate: a 2-core AMD EPYC (Zen 4), the 210 products of a step plus the output layer, cold
(ms a pass, medians of 8; a plain ``sum`` of the same bytes 17.4-21.8):

========  ==============  ==============  ========
rows      oneDNN, packed  ``F.linear``    here
========  ==============  ==============  ========
1         26.2-29.9       45-48           17.2-20.6
2         27.0-27.3       81-96           17.5-18.9
3         22.6-29.8                       18.3-25.8
4         22.0-24.0                       21.9-25.7
========  ==============  ==============  ========

The kernel reads each weight row once, from its plain ``[out, in]`` layout, and keeps one
sum per input row in vector registers (``#pragma omp simd`` reductions: the compiler
vectorises the dot products without fast-math); the output rows are split between
torch's OpenMP threads. No packed copy is made, so a call at these rows skips oneDNN's
packing and its memory.

The library is compiled on first use for this CPU and cached per machine
(:mod:`~comlrl_core.models.cpu.c_library`), probed once per process against ``F.linear``,
and left off (one WARNING) where it fails to build, load or agree; also off with
``COMLRL_ROW_PRODUCTS=off``. Sums run in another order than MKL's or oneDNN's, so results
agree to rounding, not bit for bit.

Public API::

    MAX_ROWS  (3: the rows the kernel takes)
    prepare(weights, biases=None) -> RowOperand | None  (siblings side by side in the output)
    product(x [R, in], operand, out=None) -> [R, operand.width] | None  (one call, no weight checks)
    row_product(x [R, in], weight [out, in], bias [out] | None, out=None) -> [R, out] | None
    kernel_status() -> str  ("on", or why it is off)
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import Sequence

import torch
import torch.nn.functional as F

from comlrl_core.models.cpu import c_library

logger = logging.getLogger(__name__)

ENV_VAR = "COMLRL_ROW_PRODUCTS"  # "off" keeps oneDNN's and MKL's products
MAX_ROWS = 3  # at 4 rows oneDNN's packed kernel is as fast (table above)

MAX_WEIGHTS = 8  # weights of one prepared operand (siblings side by side: q/k/v is 3)

_SOURCE = r"""
/* Weights w[0..count) of outs[k] rows each, side by side in the output (weight k's
   columns start at the sum of the earlier outs): for 1 <= rows <= 3,
   y[r * ldy + start_k + o] = bias_k[o] + sum_i x[r * ldx + i] * w_k[o * in + i]. */
void comlrl_row_products(int rows, int count, const int *outs, int in, int threads,
                         const float *restrict x, long ldx, const float *const *w, const float *const *bias,
                         float *restrict y, long ldy) {
    int starts[9];
    starts[0] = 0;
    for (int k = 0; k < count && k < 8; ++k) starts[k + 1] = starts[k] + outs[k];
    const int total = starts[count < 8 ? count : 8];
    const float *restrict x0 = x;
    const float *restrict x1 = x + (rows > 1 ? ldx : 0);
    const float *restrict x2 = x + (rows > 2 ? 2 * ldx : 0);
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int column = 0; column < total; ++column) {
        int k = 0;
        while (column >= starts[k + 1]) ++k;
        const int o = column - starts[k];
        const float *restrict wo = w[k] + (long)o * in;
        const float b = bias[k] ? bias[k][o] : 0.f;
        if (rows == 1) {
            float a0 = 0.f;
            #pragma omp simd reduction(+:a0)
            for (int i = 0; i < in; ++i) a0 += wo[i] * x0[i];
            y[column] = a0 + b;
        } else if (rows == 2) {
            float a0 = 0.f, a1 = 0.f;
            #pragma omp simd reduction(+:a0,a1)
            for (int i = 0; i < in; ++i) { a0 += wo[i] * x0[i]; a1 += wo[i] * x1[i]; }
            y[column] = a0 + b;
            y[ldy + column] = a1 + b;
        } else {
            float a0 = 0.f, a1 = 0.f, a2 = 0.f;
            #pragma omp simd reduction(+:a0,a1,a2)
            for (int i = 0; i < in; ++i) { a0 += wo[i] * x0[i]; a1 += wo[i] * x1[i]; a2 += wo[i] * x2[i]; }
            y[column] = a0 + b;
            y[ldy + column] = a1 + b;
            y[2 * ldy + column] = a2 + b;
        }
    }
}
"""

_VOID_P, _INT, _LONG = ctypes.c_void_p, ctypes.c_int, ctypes.c_long


class _Kernel:
    """The loaded library's entry point, typed."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library  # kept: the function lives as long as it does
        self.products = library.comlrl_row_products
        self.products.argtypes = [_INT, _INT, _VOID_P, _INT, _INT, _VOID_P, _LONG, _VOID_P, _VOID_P, _VOID_P, _LONG]
        self.products.restype = None


class RowOperand:
    """Weights prepared for the kernel: one ``[out, in]`` weight, or siblings of one input
    width whose outputs lie side by side (``width`` columns in all), each with an optional
    bias. Holds the tensors (their data must not move while it is used) and the pointer
    arrays, so that a product is one call with no checks of the weights."""

    def __init__(self, kernel: _Kernel, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None]) -> None:
        self.kernel = kernel
        self.weights = tuple(weights)
        self.biases = tuple(biases)
        self.in_features = self.weights[0].shape[1]
        self.width = sum(w.shape[0] for w in self.weights)
        self.tracked = any(t is not None and t.requires_grad for t in (*self.weights, *self.biases))
        count = len(self.weights)
        self._outs = (_INT * count)(*(w.shape[0] for w in self.weights))
        self._weights = (_VOID_P * count)(*(w.data_ptr() for w in self.weights))
        self._biases = (_VOID_P * count)(*(None if b is None else b.data_ptr() for b in self.biases))

    def run(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """``out [R, width]`` (rows may be strided) from ``x [R, in]`` (unit column stride)."""
        self.kernel.products(
            x.shape[0], len(self.weights), self._outs, self.in_features, torch.get_num_threads(),
            x.data_ptr(), x.stride(0), self._weights, self._biases, out.data_ptr(), out.stride(0),
        )  # fmt: skip


def _probe(kernel: _Kernel) -> str | None:
    """None when the kernel agrees with ``F.linear`` at 1-3 rows, with and without a bias,
    on row-strided inputs and outputs, one weight and three side by side."""
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(outputs, 45, generator=generator) for outputs in (37, 5, 11)]
    biases = [torch.randn(w.shape[0], generator=generator) for w in weights]
    for rows in range(1, MAX_ROWS + 1):
        x = torch.randn(rows, 50, generator=generator)[:, 2:47]  # rows 50 apart
        for members, with_bias in ((weights[:1], biases[:1]), (weights, [biases[0], None, biases[2]])):
            operand = RowOperand(kernel, members, with_bias)
            out = torch.full((rows, operand.width + 3), float("nan"))[:, 1 : operand.width + 1]
            operand.run(x, out)
            want = torch.cat([F.linear(x, w, b) for w, b in zip(members, with_bias, strict=True)], dim=1)
            if not torch.allclose(out, want, rtol=1e-4, atol=1e-4):
                gap = (out - want).abs().nan_to_num(1e9).max().item()
                return f"its results differ from F.linear's by up to {gap:.3g}"
    return None


@functools.cache
def _kernel() -> _Kernel | str:
    """The loaded, probed kernel, or why there is none (once per process)."""
    return c_library.probed_kernel(
        "row_products",
        _SOURCE,
        ENV_VAR,
        _Kernel,
        _probe,
        logger,
        "few-row product kernel",
        "products keep oneDNN's and MKL's kernels",
    )


def kernel_status() -> str:
    """``"on"`` when :func:`row_product` can run its kernel, else why not."""
    found = _kernel()
    return "on" if isinstance(found, _Kernel) else found


def _weights_fit(weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None]) -> bool:
    """fp32 CPU weights, each contiguous ``[out, in]`` of one input width (at most
    :data:`MAX_WEIGHTS`), each bias None or a contiguous fp32 CPU ``[out]``."""
    if not 0 < len(weights) <= MAX_WEIGHTS or len(biases) != len(weights):
        return False
    width = weights[0].shape[-1] if weights[0].dim() == 2 else -1
    for weight, bias in zip(weights, biases, strict=True):
        if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
            return False
        if weight.shape[1] != width or width == 0 or weight.shape[0] == 0 or not weight.is_contiguous():
            return False
        if bias is not None and (
            bias.dtype != torch.float32 or bias.device.type != "cpu" or bias.shape != (weight.shape[0],)
        ):
            return False
        if bias is not None and not bias.is_contiguous():
            return False
    return True


def _input_fits(x: torch.Tensor, in_features: int, width: int, out: torch.Tensor | None, tracked: bool) -> bool:
    """``x [R, in_features]`` (1 <= R <= :data:`MAX_ROWS`, unit column stride) and ``out``
    (None, or ``[R, width]`` with unit column stride), fp32 CPU tensors, no gradient to
    track (``tracked``: the weights')."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2 or not 0 < x.shape[0] <= MAX_ROWS:
        return False
    if x.shape[1] != in_features or x.stride(1) != 1 or x.stride(0) < 0:
        return False
    if torch.is_grad_enabled() and (tracked or x.requires_grad or (out is not None and out.requires_grad)):
        return False
    if out is None:
        return True
    if out.dtype != torch.float32 or out.device.type != "cpu" or out.shape != (x.shape[0], width):
        return False
    return out.stride(1) == 1 and out.stride(0) >= 0


def prepare(weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None] | None = None) -> RowOperand | None:
    """``weights`` (and their ``biases``; None: none) prepared for :func:`product`: fp32
    CPU tensors, each weight contiguous ``[out, in]`` of one input width, at most
    :data:`MAX_WEIGHTS` of them. None where the kernel is off or they do not fit it."""
    biases = list(biases) if biases is not None else [None] * len(weights)
    if not _weights_fit(weights, biases):
        return None
    kernel = _kernel()
    if not isinstance(kernel, _Kernel):
        return None
    return RowOperand(kernel, weights, biases)


def product(x: torch.Tensor, operand: RowOperand, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """``x [R, in]`` (1 <= R <= :data:`MAX_ROWS`, unit column stride) times the prepared
    weights: ``[R, width]``, the weights' outputs side by side, written into ``out`` (rows
    may be strided; it must not overlap ``x``) or a new tensor. None where ``x`` or ``out``
    does not fit, or gradients would be tracked (the caller runs its own product)."""
    if not _input_fits(x, operand.in_features, operand.width, out, operand.tracked):
        return None
    if out is None:
        out = torch.empty(x.shape[0], operand.width)
    operand.run(x, out)
    return out


def row_product(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
) -> torch.Tensor | None:
    """``F.linear(x, weight, bias)`` for ``x [R, in]`` with 1 <= R <= :data:`MAX_ROWS` and
    a contiguous ``weight [out, in]``, written into ``out`` (``[R, out]``, rows may be
    strided: a column block of a wider buffer) or a new tensor. None where the kernel is
    off or the tensors do not fit it (fp32 CPU tensors without tracked gradients, unit
    column strides): the caller runs its own product. Everything is checked before the
    kernel is looked up."""
    if not _weights_fit([weight], [bias]):
        return None
    tracked = weight.requires_grad or (bias is not None and bias.requires_grad)
    if not _input_fits(x, weight.shape[1], weight.shape[0], out, tracked):
        return None
    kernel = _kernel()
    if not isinstance(kernel, _Kernel):
        return None
    return product(x, RowOperand(kernel, [weight], [bias]), out)  # the weights checked above, not again by prepare
