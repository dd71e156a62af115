"""Which fp32 weight layout decodes fastest on this CPU, decided by measuring it.

A decoding step multiplies a few rows by every weight of the model. Two ways to do that in
fp32, with the same arithmetic up to summation order:

- ``"mkl"``: the plain layers (MKL's GEMM, which re-lays out each weight at every call),
  plus MKL's packed copy of the vocabulary projection where a call is big enough
  (:mod:`comlrl_core.models.cpu.packed_linear`);
- ``"onednn"``: every linear weight reordered once per sampling call into oneDNN's blocked
  layout; one packing serves any row count. The copies cost the layers' size while the
  call runs.

Which is faster depends on the CPU, in either direction. SmolLM2-135M's 210 layer weights
(425 MB), 2 threads, one pass, plain MKL -> oneDNN packed:

==================  ==============  ==============  ==============
CPU                 1 row           4 rows          16 rows
==================  ==============  ==============  ==============
AMD EPYC (Zen 4)    37.2 -> 20.3 ms 49.2 -> 17.6 ms 62.1 -> 27.2 ms
Xeon (AMX)          13.4 -> 21.1 ms 19.1 -> 20.3 ms 28.2 -> 27.8 ms
==================  ==============  ==============  ==============

So nothing is assumed. The first call of a row-count class (1 row, 2-7, 8 or more) times one
pass over the model's own weights each way, taking turns, best of three. The answer is kept
for the process. oneDNN is used where it saves at least :data:`MIN_SAVING` of a pass and
the saving over the call's tokens exceeds the measured packing time. Models whose linear
weights total less than :data:`MEASURE_MIN_BYTES` keep ``"mkl"`` without measuring: too
small for the choice to matter, and small test models stay deterministic.

Opt-in for now: ``COMLRL_FP32_LAYOUT=auto`` measures as above; ``=onednn`` forces oneDNN;
unset (or ``=mkl``) keeps MKL. The packed copies cost the layers' size while a call runs,
and with them the main job peaked at 2.81 GiB RSS on an AMD EPYC (2026-12-06), over the
2.5 GiB it must stay under; until the copies fit in that budget, the default leaves them off.

Public API::

    layout_for(weights, rows, new_tokens) -> "mkl" | "onednn"
    measured() -> list[Measurement]   (this process's measurements, for benchmarks)
    onednn_pack(weight, rows) / onednn_linear(x, packed, bias)
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Literal, Sequence

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

Layout = Literal["mkl", "onednn"]

# oneDNN must save at least this share of a pass: below it, timing noise decides
MIN_SAVING = 0.10
# models with fewer bytes of linear weights keep "mkl" unmeasured
MEASURE_MIN_BYTES = 64 << 20
ENV_VAR = "COMLRL_FP32_LAYOUT"
_REPEATS = 3


@dataclass(frozen=True)
class Measurement:
    """One row-count class's timing: a pass over the weights plain and packed, the packing."""

    rows: int
    plain_ms: float
    packed_ms: float
    pack_ms: float
    weight_mb: float
    threads: int

    @property
    def saving_ms(self) -> float:
        return self.plain_ms - self.packed_ms

    def faster(self) -> bool:
        """oneDNN saves at least MIN_SAVING of a pass."""
        return self.packed_ms <= (1.0 - MIN_SAVING) * self.plain_ms

    @property
    def verdict(self) -> str:
        return "oneDNN-packed" if self.faster() else "plain (MKL)"

    def describe(self) -> str:
        return (
            f"{self.rows} row(s), {self.weight_mb:.0f} MB of weights, {self.threads} thread(s): "
            f"a pass {self.plain_ms:.1f} ms plain, {self.packed_ms:.1f} ms oneDNN-packed; "
            f"packing {self.pack_ms:.0f} ms"
        )


_measured: dict[tuple[Any, ...], Measurement] = {}


def onednn_pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """``weight [out, in]`` (fp32) in oneDNN's blocked layout for about ``rows`` input rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, max(rows, 1))


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` on a weight from :func:`onednn_pack` (any row count)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def row_class(rows: int) -> int:
    """The row count a class of calls is measured at: 1, 4 (2-7 rows) or 16 (8 or more)."""
    return 1 if rows <= 1 else 4 if rows < 8 else 16


def forced_layout() -> Layout | None:
    """The layout the environment forces (unset: ``"mkl"``, the default), or None (``auto``: measure)."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value == "auto":
        return None
    if value == "":
        return "mkl"
    if value not in ("mkl", "onednn"):
        raise ValueError(f"{ENV_VAR}={value!r}: use 'mkl' (the default), 'onednn' or 'auto' (measure)")
    return "mkl" if value == "mkl" else "onednn"


def _timed_pass(fn: Any, operands: Sequence[tuple[torch.Tensor, Any, torch.Tensor | None]]) -> float:
    start = time.perf_counter()
    for x, weight, bias in operands:
        fn(x, weight, bias)
    return (time.perf_counter() - start) * 1e3


def measure(weights: Sequence[torch.Tensor], rows: int) -> Measurement:
    """Time one pass over ``weights`` at ``rows`` rows with plain ``F.linear`` and with
    oneDNN-packed copies (best of three each, taking turns), and the packing itself."""
    gen = torch.Generator().manual_seed(0)
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], generator=gen) for w in weights}
    with torch.no_grad():
        start = time.perf_counter()
        packed = [onednn_pack(w, rows) for w in weights]
        pack_ms = (time.perf_counter() - start) * 1e3
        plain_ops = [(inputs[w.shape[1]], w, None) for w in weights]
        packed_ops = [(inputs[w.shape[1]], p, None) for w, p in zip(weights, packed, strict=True)]
        plain_ms = packed_ms = float("inf")
        for turn in range(_REPEATS):  # taking turns: a drifting machine favours neither
            order = (0, 1) if turn % 2 == 0 else (1, 0)
            for which in order:
                if which == 0:
                    plain_ms = min(plain_ms, _timed_pass(F.linear, plain_ops))
                else:
                    packed_ms = min(packed_ms, _timed_pass(onednn_linear, packed_ops))
    weight_mb = sum(w.numel() * w.element_size() for w in weights) / 1e6
    return Measurement(rows, plain_ms, packed_ms, pack_ms, weight_mb, torch.get_num_threads())


def layout_for(weights: Sequence[torch.Tensor], rows: int, new_tokens: int | None) -> Layout:
    """The fp32 layout for a sampling call of ``rows`` rows decoding ``new_tokens`` tokens
    each (None: unknown, packing assumed to pay) over these linear ``weights``."""
    forced = forced_layout()
    if forced is not None:
        return forced
    if not weights or sum(w.numel() * w.element_size() for w in weights) < MEASURE_MIN_BYTES:
        return "mkl"
    measured_rows = row_class(rows)
    key = (tuple(tuple(w.shape) for w in weights), measured_rows, torch.get_num_threads())
    found = _measured.get(key)
    if found is None:
        found = _measured[key] = measure(weights, measured_rows)
        logger.info("fp32 decoding layout measured, %s -> %s", found.describe(), found.verdict)
    if not found.faster():
        return "mkl"
    if new_tokens is not None and found.saving_ms * new_tokens < found.pack_ms:
        return "mkl"  # too short a call to win the packing back
    return "onednn"


def measured() -> list[Measurement]:
    """This process's measurements, in the order they were made."""
    return list(_measured.values())
