"""Which fp32 weight layout decodes fastest on this CPU, decided by measuring it.

A decoding step multiplies a few rows by every weight of the model. Two ways to do that in
fp32, with the same arithmetic up to summation order:

- ``"mkl"``: the plain layers (MKL's GEMM, which re-lays out each weight at every call),
  plus MKL's packed copy of the vocabulary projection where it pays: measured too
  (:func:`mkl_packing_pays`), since it pays at one row on an AMD EPYC (7.2 -> 3.5 ms a
  step for SmolLM2's) and not on a Xeon (:mod:`comlrl_core.models.cpu.packed_linear`);
- ``"onednn"``: every linear weight reordered once per sampling call into oneDNN's blocked
  layout; one packing serves any row count. The packed copy stands in for the plain
  weight while the call runs (``packed_linear``).

Which is faster depends on the CPU, in either direction. SmolLM2-135M's 210 layer weights
(425 MB), 2 threads, one pass, plain MKL -> oneDNN packed:

==================  ==============  ==============  ==============
CPU                 1 row           4 rows          16 rows
==================  ==============  ==============  ==============
AMD EPYC (Zen 4)    37.2 -> 20.3 ms 49.2 -> 17.6 ms 62.1 -> 27.2 ms
AMD EPYC (Zen 3)*   30.5 -> 25.8 ms 56.9 -> 31.6 ms 63.5 -> 54.2 ms
Xeon (AMX)          13.4 -> 21.1 ms 19.1 -> 20.3 ms 28.2 -> 27.8 ms
==================  ==============  ==============  ==============

(* medians of 7 passes, q/k/v and gate/up stacked in oneDNN, 2026-12-07.)
So nothing is assumed. The first call of a row-count class (1 row, 2-7, 8 or more) times one
pass over a sample of the model's own weights (:func:`measured_sample`: the first
:data:`MEASURE_SAMPLE_BYTES`, whole blocks) each way, taking turns, best of three. The answer
is kept for the process, and on disk for later processes on the same machine
(:mod:`comlrl_core.models.cpu.layout_record`: the timing moves with the machine's load, and
a seeded run must decide as the run before it did). The first :data:`RECORD_MEASUREMENTS`
processes on a machine each time the case again and keep the best pass of each side over
all their timings (load only ever slows a pass, so the minimum is the quiet machine's
time): one measurement taken while the machine was busy does not fix the decision for
good. From then on the record decides. oneDNN is used where it saves at least
:data:`MIN_SAVING` of a pass and the saving over the call's tokens exceeds the measured
packing time plus the time to rebuild the plain weights from the packed copies at the
call's end (oneDNN's copies stand in for them; at one row on an AMD EPYC the restore tipped
48-token calls back to MKL, where decoding measured no faster in oneDNN). Models whose
linear weights total less than :data:`MEASURE_MIN_BYTES` keep ``"mkl"`` without measuring: too
small for the choice to matter, and small test models stay deterministic.

The default (``COMLRL_FP32_LAYOUT`` unset, or ``=auto``) measures as above; ``=onednn``
forces oneDNN, ``=mkl`` keeps MKL. While a call runs, a packed copy replaces its layer's
plain weight (``packed_linear``), so the layout costs no memory beyond the weights tied to
another module (the output layer tied to the embeddings) and the measurement's sample.

Public API::

    layout_for(weights, rows, new_tokens) -> "mkl" | "onednn"
    mkl_packing_pays(large weights, rows, new_tokens) -> bool | None  (None: too small to measure)
    measured() -> list[Measurement]   (this process's measurements, for benchmarks)
    decision_lines() -> list[str]     (what decided the layouts, for run reports)
    onednn_pack(weight, rows) / onednn_linear(x, packed, bias)
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal, Sequence

import torch
import torch.nn.functional as F

from comlrl_core.models.cpu import layout_record

logger = logging.getLogger(__name__)

Layout = Literal["mkl", "onednn"]

# oneDNN must save at least this share of a pass: below it, timing noise decides
MIN_SAVING = 0.10
# models with fewer bytes of linear weights keep "mkl" unmeasured
MEASURE_MIN_BYTES = 64 << 20
# a measurement times (and packs copies of) this much of the model's weights, not all: the
# copies are transient memory, and 128 MB is several times any last-level cache we met
MEASURE_SAMPLE_BYTES = 128 << 20
ENV_VAR = "COMLRL_FP32_LAYOUT"
_REPEATS = 3
# processes that time a case before the record alone decides it (their best passes merged)
RECORD_MEASUREMENTS = 3


@dataclass(frozen=True)
class Measurement:
    """One row-count class's timing: a pass over the weights plain and packed, the packing,
    and (oneDNN, whose packed copy stands in for the plain weight during a call) rebuilding
    the plain weights from the packed copies when the call ends."""

    rows: int
    plain_ms: float
    packed_ms: float
    pack_ms: float
    weight_mb: float
    threads: int
    packed_as: str = "oneDNN"  # the packed format timed against plain MKL
    restore_ms: float = 0.0
    measurements: int = 1  # processes whose timings this merges (best pass of each side)
    recorded: bool = False  # read from the record of an earlier process (layout_record), not timed here

    @property
    def saving_ms(self) -> float:
        return self.plain_ms - self.packed_ms

    @property
    def one_off_ms(self) -> float:
        """What a call pays once for the packed layout: packing, and restoring where it releases."""
        return self.pack_ms + self.restore_ms

    def faster(self) -> bool:
        """oneDNN saves at least MIN_SAVING of a pass."""
        return self.packed_ms <= (1.0 - MIN_SAVING) * self.plain_ms

    @property
    def verdict(self) -> str:
        return f"{self.packed_as}-packed" if self.faster() else "plain (MKL)"

    def describe(self) -> str:
        return (
            f"{self.rows} row(s), {self.weight_mb:.0f} MB of weights, {self.threads} thread(s): "
            f"a pass {self.plain_ms:.1f} ms plain, {self.packed_ms:.1f} ms {self.packed_as}-packed; "
            f"packing {self.pack_ms:.0f} ms"
            + (f" + restoring {self.restore_ms:.0f} ms" if self.restore_ms else "")
            + (f" (best of {self.measurements} processes' measurements)" if self.measurements > 1 else "")
            + (" (recorded by an earlier process)" if self.recorded else "")
        )

    def merged(self, other: Measurement) -> Measurement:
        """This measurement and ``other`` of the same case as one: the best time of each
        part (contention only slows a pass down)."""
        return replace(
            self,
            plain_ms=min(self.plain_ms, other.plain_ms),
            packed_ms=min(self.packed_ms, other.packed_ms),
            pack_ms=min(self.pack_ms, other.pack_ms),
            restore_ms=min(self.restore_ms, other.restore_ms),
            measurements=self.measurements + other.measurements,
            recorded=False,
        )


_measured: dict[tuple[Any, ...], Measurement] = {}


def onednn_pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """``weight [out, in]`` (fp32) in oneDNN's blocked layout for about ``rows`` input rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, max(rows, 1))


# oneDNN compiles a kernel for every input row count it meets and keeps it for the process
# (~0.6 MiB each for SmolLM2's layer shapes; a main job meets every count as rows finish).
# Rows are padded up to one of these counts (or a multiple of the last step past them), so
# a process keeps a few dozen kernels; the steps are fine because a decoding product's time
# grows with its rows (SmolLM2, AMD EPYC: 13 rows 37.7 ms a pass, 16 rows 42.9 ms).
ONEDNN_ROW_COUNTS = (1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64)
ONEDNN_ROW_STEP = 16
# a padded input per (rows, features): reused, so padding costs one row copy, not an allocation
_padded_inputs: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}


def onednn_rows(rows: int) -> int:
    """The row count :func:`onednn_linear` runs ``rows`` input rows at."""
    for count in ONEDNN_ROW_COUNTS:
        if rows <= count:
            return count
    return -(-rows // ONEDNN_ROW_STEP) * ONEDNN_ROW_STEP


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` on a weight from :func:`onednn_pack` (any row count; run
    at :func:`onednn_rows` rows, the padding rows' outputs dropped)."""
    features = x.shape[-1]
    rows = x.numel() // features
    padded = _PADDED_ROWS[rows] if rows < len(_PADDED_ROWS) else onednn_rows(rows)
    if padded == rows:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    buffer = _padded_inputs.get((padded, features, x.dtype))
    if buffer is None:
        buffer = _padded_inputs[(padded, features, x.dtype)] = x.new_zeros(padded, features)
    buffer[:rows].copy_(x.view(rows, features))  # the rows past them: finite leftovers, dropped
    out = torch.ops.mkldnn._linear_pointwise(buffer, packed, bias, "none", [], "")[:rows]
    return out if x.dim() == 2 else out.view(*x.shape[:-1], out.shape[-1])


_PADDED_ROWS = [onednn_rows(rows) for rows in range(ONEDNN_ROW_COUNTS[-1] + 1)]


def row_class(rows: int) -> int:
    """The row count a class of calls is measured at: 1, 4 (2-7 rows) or 16 (8 or more)."""
    return 1 if rows <= 1 else 4 if rows < 8 else 16


def forced_layout() -> Layout | None:
    """The layout the environment forces, or None (unset or ``auto``, the default: measure)."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in ("mkl", "onednn"):
        raise ValueError(f"{ENV_VAR}={value!r}: use 'auto' (the default: measure), 'mkl' or 'onednn'")
    return "mkl" if value == "mkl" else "onednn"


def _timed_pass(fn: Any, operands: Sequence[tuple[torch.Tensor, Any, torch.Tensor | None]]) -> float:
    start = time.perf_counter()
    for x, weight, bias in operands:
        fn(x, weight, bias)
    return (time.perf_counter() - start) * 1e3


# a weight, or a set of weights packed stacked as one (sibling layers that read one input)
Weights = torch.Tensor | tuple[torch.Tensor, ...]


def _members(weight: Weights) -> tuple[torch.Tensor, ...]:
    return weight if isinstance(weight, tuple) else (weight,)


def _nbytes(weights: Sequence[Weights]) -> int:
    return sum(w.numel() * w.element_size() for item in weights for w in _members(item))


def _shapes(weight: Weights) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(w.shape) for w in _members(weight))


def measured_sample(weights: Sequence[Weights], max_bytes: int = MEASURE_SAMPLE_BYTES) -> list[Weights]:
    """The first weights, in model order, that reach ``max_bytes`` (at least one): whole
    blocks of every shape, with packed copies that stay well under the model's size."""
    sample: list[Weights] = []
    total = 0
    for weight in weights:
        if sample and total >= max_bytes:
            break
        sample.append(weight)
        total += _nbytes([weight])
    return sample


def _measure_packing(
    weights: Sequence[Weights], rows: int, pack: Any, packed_pass: Any, packed_as: str, restore: Any = None
) -> Measurement:
    """One pass over ``weights`` at ``rows`` rows plain (``F.linear``, each weight of a set
    on its own) and on the copies ``pack(weight, rows)`` makes (``packed_pass(x, copy,
    weight)``; a set stacked into one copy), best of three each, taking turns (a drifting
    machine favours neither), the packing itself, and ``restore(copy)`` over the copies
    where given."""
    gen = torch.Generator().manual_seed(0)
    plain = [w for item in weights for w in _members(item)]
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], generator=gen) for w in plain}
    with torch.no_grad():
        start = time.perf_counter()
        stacked = [torch.cat(item) if isinstance(item, tuple) else item for item in weights]
        packed = [pack(w, rows) for w in stacked]
        pack_ms = (time.perf_counter() - start) * 1e3
        plain_ops = [(inputs[w.shape[1]], w, None) for w in plain]
        packed_ops = [(inputs[w.shape[1]], p, w) for w, p in zip(stacked, packed, strict=True)]
        del stacked
        # one untimed pass each first: first calls create oneDNN's kernels and touch the inputs
        _timed_pass(F.linear, plain_ops)
        _timed_pass(packed_pass, packed_ops)
        plain_ms = packed_ms = float("inf")
        for turn in range(_REPEATS):
            order = (0, 1) if turn % 2 == 0 else (1, 0)
            for which in order:
                if which == 0:
                    plain_ms = min(plain_ms, _timed_pass(F.linear, plain_ops))
                else:
                    packed_ms = min(packed_ms, _timed_pass(packed_pass, packed_ops))
        restore_ms = 0.0
        if restore is not None:
            start = time.perf_counter()
            for copy in packed:
                restore(copy)
            restore_ms = (time.perf_counter() - start) * 1e3
    weight_mb = _nbytes(weights) / 1e6
    return Measurement(rows, plain_ms, packed_ms, pack_ms, weight_mb, torch.get_num_threads(), packed_as, restore_ms)


def measure(weights: Sequence[Weights], rows: int) -> Measurement:
    """Time one pass over ``weights`` at ``rows`` rows with plain ``F.linear`` and with
    oneDNN-packed copies (a set of weights stacked into one; best of three each, taking
    turns), the packing itself, and the restore (``to_dense``) that gives a call's released
    plain weights back at its end."""
    return _measure_packing(
        weights, rows, onednn_pack, lambda x, p, w: onednn_linear(x, p, None), "oneDNN", lambda p: p.to_dense()
    )


def measure_mkl_packing(weights: Sequence[torch.Tensor], rows: int) -> Measurement:
    """Time one pass over ``weights`` at ``rows`` rows with plain ``F.linear`` and with MKL's
    packed copies for exactly that row count (best of three each, taking turns), and the
    packing itself."""
    return _measure_packing(
        weights,
        rows,
        torch.ops.mkl._mkl_reorder_linear_weight,
        lambda x, p, w: torch.ops.mkl._mkl_linear(x, p, w, None, x.shape[0]),
        "MKL",
    )


def _packing_pays(
    kind: str, weights: Sequence[Weights], rows: int, new_tokens: int | None, measure_fn: Any
) -> bool | None:
    """Whether packed copies of ``weights`` (timed by ``measure_fn``) pay for a call of
    ``rows`` rows decoding ``new_tokens`` tokens each (None: unknown, assumed to pay),
    measured once per ``kind``, row-count class and machine (kept in the process and in
    :mod:`~comlrl_core.models.cpu.layout_record`'s file); None when the weights are too
    small to measure."""
    if not weights or _nbytes(weights) < MEASURE_MIN_BYTES:
        return None
    measured_rows = row_class(rows)
    key = (kind, tuple(_shapes(w) for w in weights), measured_rows, torch.get_num_threads())
    found = _measured.get(key)
    if found is None:
        record_key = layout_record.case_key(*key)
        found = _from_record(record_key)
        if found is None or found.measurements < RECORD_MEASUREMENTS:
            # the decision compares ratios (speed, packing per saving), which a sample keeps
            fresh = measure_fn(measured_sample(weights), measured_rows)
            found = fresh if found is None else found.merged(fresh)
            layout_record.record(record_key, {k: v for k, v in asdict(found).items() if k != "recorded"})
        _measured[key] = found
        logger.info("fp32 %s measured, %s -> %s", kind, found.describe(), found.verdict)
    if not found.faster():
        return False
    return new_tokens is None or found.saving_ms * new_tokens >= found.one_off_ms  # else too short a call


def _from_record(record_key: str) -> Measurement | None:
    """An earlier process's measurement of this case (layout_record), or None."""
    stored = layout_record.recorded(record_key)
    names = {f.name for f in fields(Measurement)} - {"recorded"}
    if stored is None or set(stored) != names:
        return None  # none, or written by a version with other fields: measured again
    numbers = [v for k, v in stored.items() if k != "packed_as"]
    if not isinstance(stored["packed_as"], str) or any(
        isinstance(v, bool) or not isinstance(v, (int, float)) for v in numbers
    ):
        return None
    if not isinstance(stored["measurements"], int) or stored["measurements"] < 1:
        return None
    return Measurement(**stored, recorded=True)


def mkl_packing_pays(weights: Sequence[torch.Tensor], rows: int, new_tokens: int | None) -> bool | None:
    """Whether MKL's packed copies of these (large) ``weights`` pay for a call of ``rows``
    rows decoding ``new_tokens`` tokens each, measured once per machine and row-count
    class; None when they are too small to measure (the caller keeps its fixed rule).

    Measured because the answer depends on the CPU: SmolLM2's vocabulary projection at one
    row took 7.2 ms plain and 3.5 ms packed on an AMD EPYC, while on a Xeon packing did not
    pay at one row."""
    return _packing_pays("packing of the large weights", weights, rows, new_tokens, measure_mkl_packing)


def layout_for(weights: Sequence[Weights], rows: int, new_tokens: int | None) -> Layout:
    """The fp32 layout for a sampling call of ``rows`` rows decoding ``new_tokens`` tokens
    each (None: unknown, packing assumed to pay) over these linear ``weights`` (a tuple:
    sibling weights oneDNN packs stacked as one)."""
    forced = forced_layout()
    if forced is not None:
        return forced
    return "onednn" if _packing_pays("decoding layout", weights, rows, new_tokens, measure) else "mkl"


def measured() -> list[Measurement]:
    """This process's measurements, in the order they were made."""
    return list(_measured.values())


def decision_lines() -> list[str]:
    """What decided this process's fp32 layouts, one line each: a forced setting, where the
    measurements are kept, every measurement and its verdict (for run reports and benchmarks)."""
    setting = os.environ.get(ENV_VAR)
    lines = [f"{ENV_VAR}={setting}"] if setting else []
    path = layout_record.record_path()
    lines.append(f"measurements kept in {path}" if path else f"{layout_record.ENV_VAR}=off: measured in this process")
    for m in measured():
        what = "weight layout" if m.packed_as == "oneDNN" else "packing of the large weights"
        lines.append(f"{what}, measured at {m.describe()} -> {m.verdict}")
    return lines
