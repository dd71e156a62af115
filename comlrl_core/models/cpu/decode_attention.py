"""A decoding step's grouped-query attention on the CPU, in a small compiled kernel.

A decoding step's attention reads every cached key and value once: at batch 16 with
~330 cached tokens that is ~8 MB a layer of SmolLM2-135M, from main memory (the step's
weight stream has long evicted it). The batched GEMMs of ``baddbmm`` + ``softmax`` +
``bmm`` (MKL) run there at about half the rate a plain read of the same bytes gets: each
of their 3 x L products per key/value head is too small for the library. Two loops
over the cache do better (a 2-core AMD EPYC, Zen 4, 30 layers of a 16-row cache of 330
tokens, cold, in one run: scores 439-445 -> 267-296 us, weights x values 457-478 -> 238-248
us a layer; a batch-16 SmolLM2-135M step 69.1 -> 59.2 ms; docs/performance.md):

- scores: ``bias + (scale * q) . k`` per token, the keys read row by row from their
  token-contiguous storage (``kv_cache``);
- mix: ``sum_t w[t] * v[t]``, the values read token by token, the sums kept in a block
  per key/value head.

The softmax between them stays torch's. The kernel is C, compiled on first use for this
CPU and cached per machine (:mod:`~comlrl_core.models.cpu.c_library`). It runs on torch's
own OpenMP runtime (same ``libgomp``, same thread count), so it adds no thread pool of
its own.

It is used only where everything holds: Linux, a C compiler (``$CC``, else ``cc`` or
``gcc``), torch running on GNU OpenMP, fp32 CPU tensors without gradients, keys stored
token-contiguous and values row-contiguous, at most 16 query heads per key/value head
and a head size of at most 256. Otherwise, or with ``COMLRL_DECODE_ATTENTION=off``, the
caller runs :func:`torch_attention` (:func:`comlrl_core.models.lean_ops.attend` does). The library is
probed once per process against torch's ops on a masked case; where it fails to build,
load or agree, the process keeps torch's ops and logs one WARNING saying why. The sums
run in another order than MKL's, so results agree to rounding, not bit for bit.

Public API::

    decode_attention(q [BH, G, D], keys [BH, L, D], values [BH, L, D], bias [BH, 1, L], scale) -> [BH, G, D] | None
    torch_attention(q, keys, values, bias, scale) -> [BH, G, D]  (the same in torch's ops)
    kernel_status() -> str  ("on", or why it is off)
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

from comlrl_core.models.cpu import c_library

logger = logging.getLogger(__name__)

ENV_VAR = "COMLRL_DECODE_ATTENTION"  # "off" keeps torch's ops
MAX_GROUPS = 16  # query heads per key/value head (the mix kernel's block of sums)
MAX_HEAD_DIM = 256

_SOURCE = r"""
#include <string.h>

/* scores[bh][g][t] = bias[bh][t] + sum_d (scale * q[bh][g][d]) * k[bh][d][t]
   (keys token-contiguous: element (t, d) of head bh at k + bh * k_bh + d * k_d + t) */
void comlrl_gqa_scores(int bh_count, int groups, int dim, int length, int threads,
                       const float *restrict q, const float *restrict k, long k_bh, long k_d,
                       const float *restrict bias, long bias_bh, float scale, float *restrict out) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int bh = 0; bh < bh_count; ++bh) {
        const float *restrict kb = k + bh * k_bh;
        const float *restrict qb = q + (long)bh * groups * dim;
        float *restrict ob = out + (long)bh * groups * length;
        for (int g = 0; g < groups; ++g) memcpy(ob + (long)g * length, bias + bh * bias_bh, sizeof(float) * length);
        for (int d = 0; d < dim; ++d) {
            const float *restrict row = kb + d * k_d;
            for (int g = 0; g < groups; ++g) {
                const float w = scale * qb[g * dim + d];
                float *restrict o = ob + (long)g * length;
                for (int t = 0; t < length; ++t) o[t] += w * row[t];
            }
        }
    }
}

/* out[bh][g][:] = sum_t w[bh][g][t] * v[bh][t][:]  (groups <= 16, dim <= 256) */
void comlrl_gqa_mix(int bh_count, int groups, int dim, int length, int threads,
                    const float *restrict w, const float *restrict v, long v_bh, long v_t, float *restrict out) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int bh = 0; bh < bh_count; ++bh) {
        float sums[16][256];
        const float *restrict vb = v + bh * v_bh;
        const float *restrict wb = w + (long)bh * groups * length;
        for (int g = 0; g < groups; ++g) memset(sums[g], 0, sizeof(float) * dim);
        for (int t = 0; t < length; ++t) {
            const float *restrict row = vb + t * v_t;
            for (int g = 0; g < groups; ++g) {
                const float a = wb[(long)g * length + t];
                for (int d = 0; d < dim; ++d) sums[g][d] += a * row[d];
            }
        }
        float *restrict ob = out + (long)bh * groups * dim;
        for (int g = 0; g < groups; ++g) memcpy(ob + (long)g * dim, sums[g], sizeof(float) * dim);
    }
}
"""

_VOID_P, _INT, _LONG, _FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float


class _Kernel:
    """The loaded library's two entry points, typed."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library  # kept: the functions live as long as it does
        self.scores = library.comlrl_gqa_scores
        self.scores.argtypes = [_INT] * 5 + [_VOID_P, _VOID_P, _LONG, _LONG, _VOID_P, _LONG, _FLOAT, _VOID_P]
        self.scores.restype = None
        self.mix = library.comlrl_gqa_mix
        self.mix.argtypes = [_INT] * 5 + [_VOID_P, _VOID_P, _LONG, _LONG, _VOID_P]
        self.mix.restype = None


def torch_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """What the kernel computes, in torch's ops (any dtype and layout; softmax in fp32):
    the caller's path where :func:`decode_attention` returns None, and the probe's reference."""
    scores = torch.baddbmm(bias, q, keys.transpose(1, 2), alpha=scale)
    weights = scores.softmax(dim=-1, dtype=torch.float32)
    if weights.dtype != q.dtype:
        weights = weights.to(q.dtype)
    return torch.bmm(weights, values)


def _probe(kernel: _Kernel) -> str | None:
    """None when the kernel agrees with torch's ops on a masked case laid out like the cache."""
    generator = torch.Generator().manual_seed(0)
    heads, groups, dim, length, room = 6, 3, 16, 37, 41
    q = torch.randn(heads, groups, dim, generator=generator)
    keys = torch.randn(heads, dim, room, generator=generator).transpose(1, 2)[:, :length]  # token-contiguous
    values = torch.randn(heads, room, dim, generator=generator)[:, :length]
    bias = torch.zeros(heads, 1, length)
    bias[::2, :, :5] = float("-inf")  # left padding in every other row
    got = _run(kernel, q, keys, values, bias, 0.25)
    want = torch_attention(q, keys, values, bias, 0.25)
    if not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
        return f"its results differ from torch's by up to {(got - want).abs().max().item():.3g}"
    return None


@functools.cache
def _kernel() -> _Kernel | str:
    """The loaded, probed kernel, or why there is none (once per process)."""
    return c_library.probed_kernel(
        "decode_attention",
        _SOURCE,
        ENV_VAR,
        _Kernel,
        _probe,
        logger,
        "decoding attention kernel",
        "decoding keeps torch's batched products",
    )


def kernel_status() -> str:
    """``"on"`` when :func:`decode_attention` can run its kernel, else why not."""
    found = _kernel()
    return "on" if isinstance(found, _Kernel) else found


def _run(kernel: _Kernel, q, keys, values, bias, scale: float) -> torch.Tensor:
    heads, groups, dim = q.shape
    length = keys.shape[1]
    threads = torch.get_num_threads()
    scores = torch.empty(heads, groups, length)
    kernel.scores(
        heads, groups, dim, length, threads,
        q.data_ptr(), keys.data_ptr(), keys.stride(0), keys.stride(2),
        bias.data_ptr(), bias.stride(0), scale, scores.data_ptr(),
    )  # fmt: skip
    weights = scores.softmax(dim=-1)
    out = torch.empty(heads, groups, dim)
    kernel.mix(
        heads, groups, dim, length, threads,
        weights.data_ptr(), values.data_ptr(), values.stride(0), values.stride(1), out.data_ptr(),
    )  # fmt: skip
    return out


def _fits(q, keys, values, bias) -> bool:
    tensors = (q, keys, values, bias)
    if any(t.dtype != torch.float32 or t.device.type != "cpu" or t.dim() != 3 for t in tensors):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    heads, groups, dim = q.shape
    length = keys.shape[1]
    if not (0 < groups <= MAX_GROUPS and 0 < dim <= MAX_HEAD_DIM and length > 0):
        return False
    if keys.shape != (heads, length, dim) or values.shape != (heads, length, dim) or bias.shape != (heads, 1, length):
        return False
    return (
        q.is_contiguous()
        and keys.stride(1) == 1  # token-contiguous keys
        and values.stride(2) == 1
        and bias.stride(2) == 1
        and min(keys.stride(0), keys.stride(2), values.stride(0), values.stride(1)) >= 0
    )


def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor | None:
    """``softmax(bias + scale * q @ keys^T) @ values`` for ``q [BH, G, D]`` over ``keys`` and
    ``values [BH, L, D]`` with an additive ``bias [BH, 1, L]``: ``[BH, G, D]``; None where
    the kernel is off or the tensors do not fit it (the caller runs torch's ops)."""
    if not _fits(q, keys, values, bias):
        return None
    kernel = _kernel()
    if not isinstance(kernel, _Kernel):
        return None
    return _run(kernel, q, keys, values, bias, float(scale))
