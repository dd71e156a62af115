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

The packing ops are private (``torch.ops.mkldnn`` / ``torch.ops.mkl``), so each format's
path is probed once per process: a small layer packed and compared with ``F.linear``.
Where a probe fails (ops missing or changed, no MKL / oneDNN, not on CPU) the layers stay
plain and one log line says why; a packing error on a real model switches the path off
the same way. Layers whose ``forward`` is already replaced on the instance (accelerate's
hooks: offloading, device maps) are never touched.

In fp32 there are two packed formats, and which one pays depends on the CPU: MKL's (the
vocabulary projection only, as above) or oneDNN's blocked layout for every layer (one
packing serves any row count; on an AMD EPYC it runs the layers' products 1.8-2.8x faster
than plain MKL, on a Xeon no faster). :mod:`comlrl_core.models.cpu.fp32_layout` decides by
measuring the model's own weights once per process and row-count class (``COMLRL_FP32_LAYOUT``
forces either). In oneDNN's format the packed copy replaces the plain weight of a layer
whose weight no other module shares, from its first decoding pass to the end of the call:
the plain values come back from the packed copy (an exact reordering) when the block ends,
or earlier when a pass needs the plain layer (gradients on, a failing op). So the call holds
each weight once. A decoding pass feeds one position per row; every pass of several
positions is a prefill and runs plain, however few its rows (a shared prompt beginning of
40 tokens packed the weights before the prefill chunks, which then rebuilt every plain
weight from its packed copy, once a chunk). The packing is paid in the first decoding
step: it is a cost of decoding. Sibling layers that read one input (a Llama-family
attention's q/k/v, its MLP's gate/up) share one stacked packed weight in this format, so a
decoding step runs one product for each set (:mod:`comlrl_core.models.cpu.sibling_linears`;
``FUSE_SIBLINGS`` switches it off), and the layout measurement times them stacked too.
:func:`onednn_operand` hands a caller that computes a decoding product itself (the lean
decoding step, skipping the layers' module calls) a packed layer's weight and its columns.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from typing import Iterator, NamedTuple, TypeGuard

import torch
import torch.nn.functional as F
from torch import nn

from comlrl_core.models.cpu import fp32_layout, row_products
from comlrl_core.models.cpu.model_walk import ModelWalk
from comlrl_core.models.cpu.sibling_linears import FusedSiblings, sibling_groups

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

# oneDNN fp32 packing skips matrices with a side below this: LoRA's low-rank factors, whose
# products are too small for the layout to matter (the lean decoding step calls their
# weights directly anyway)
_ONEDNN_MIN_SIDE = 64
# a decoding pass (one position per row) of at most this many rows (or the call's decoding
# rows) runs on a oneDNN layer's packed weight (packing it at the first such pass); wider
# passes and passes of several positions (the prefill, a short shared prompt beginning)
# run plain
_ONEDNN_PACK_MAX_ROWS = 64

# the packed formats: oneDNN bf16 (under bf16 autocast or for bf16 weights), MKL fp32, oneDNN fp32
BF16 = "bf16-onednn"
FP32_MKL = "fp32-mkl"
FP32_ONEDNN = "fp32-onednn"

# oneDNN fp32: sibling layers that read one input (q/k/v, gate/up) share one stacked packed
# weight (sibling_linears; SmolLM2, AMD EPYC, 1 row: the layers' pass 23.7 -> 19.8 ms)
FUSE_SIBLINGS = True

# formats whose packing failed on a real model in this process (probes passed, a layer did not)
_broken: set[str] = set()

# per thread: how many prompt_pass() blocks are open
_prompt_passes = threading.local()


@contextlib.contextmanager
def prompt_pass() -> Iterator[None]:
    """Within the block, every pass through a packed layer counts as a prefill, whatever
    its shape: a prompt pass that feeds part of the model one position per row (the last
    layer's MLP on the last position, :mod:`comlrl_core.models.last_position_mlp`) packs
    nothing; the packing stays a cost of the first decoding step."""
    depth = getattr(_prompt_passes, "depth", 0)
    _prompt_passes.depth = depth + 1
    try:
        yield
    finally:
        _prompt_passes.depth = depth


class _PackedForward:
    """Replacement ``forward`` of one linear layer while packing is active."""

    def __init__(
        self,
        layer: nn.Linear,
        packed_format: str,
        rows: int,
        release_plain: bool = False,
        siblings: tuple[FusedSiblings, int] | None = None,
    ) -> None:
        self.layer, self.original = layer, layer.forward
        self.format, self.rows = packed_format, rows
        # oneDNN fp32: (the stacked weight this layer shares with its siblings, its place there)
        self.siblings = siblings if packed_format == FP32_ONEDNN else None
        # oneDNN fp32: the packed copy stands in for a weight no other module shares (the
        # plain values come back from it, an exact reordering), so the call holds it once
        self.release_plain, self.released = release_plain and packed_format == FP32_ONEDNN, False
        weight = layer.weight.detach()
        bias = layer.bias.detach() if layer.bias is not None else None
        self.weight: torch.Tensor | None = None
        if packed_format == BF16:
            self.bias = bias.to(torch.bfloat16) if bias is not None else None
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16), rows)
        elif packed_format == FP32_ONEDNN:
            # packed at the first decoding-sized pass: a call's prefill (more rows than it
            # decodes) runs plain, so the packing pass is paid where it is won back
            self.bias, self.packed = bias, None
        else:
            self.bias, self.weight = bias, weight
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.format in _broken or (torch.is_grad_enabled() and (x.requires_grad or self.layer.weight.requires_grad)):
            return self._plain_call(x)
        try:
            return self._packed_call(x)
        except Exception as exc:  # noqa: BLE001 - private ops: this call and the rest go plain
            _switch_off(self.format, exc)
            return self._plain_call(x)

    def _plain_call(self, x: torch.Tensor) -> torch.Tensor:
        self.restore()
        return self.original(x)

    def restore(self) -> None:
        """Put a released weight's plain values back (from the packed copy)."""
        if self.siblings is not None:
            self.siblings[0].restore()  # every sibling's: one plain pass needs them all back
        if self.released:
            assert self.packed is not None
            # outside inference mode even when the call ran in it: a weight made there would
            # be an inference tensor, which no later training pass could use
            with torch.inference_mode(False):
                self.layer.weight.data = self.packed.to_dense()
            self.released = False

    def _packed_call(self, x: torch.Tensor) -> torch.Tensor:
        if self.format == BF16:
            return torch.ops.mkldnn._linear_pointwise(x.to(torch.bfloat16), self.packed, self.bias, "none", [], "")
        if x.dtype != torch.float32:
            return self.original(x)
        rows = x.numel() // x.shape[-1]
        if self.format == FP32_ONEDNN:  # one packing serves every decoding row count
            # a decoding pass feeds one position per row; a pass of several (a prefill chunk,
            # a shared prompt beginning however short) is a prefill
            positions = x.shape[-2] if x.dim() >= 3 else 1
            prefill = (
                positions > 1 or rows > max(self.rows, _ONEDNN_PACK_MAX_ROWS) or getattr(_prompt_passes, "depth", 0) > 0
            )
            if self.siblings is not None:
                fused, index = self.siblings
                if prefill and not fused.released:
                    return self.original(x)
                return fused.output(index, x, decoding=not prefill)
            if prefill:
                # a prefill pass runs plain: before the packing (paid where it is won back)
                # and after it (oneDNN would keep a kernel for each prefill width it meets)
                if self.packed is None or not self.released:
                    return self.original(x)
                return F.linear(x, self.packed.to_dense(), self.bias)
            if self.packed is None:
                self.packed = fp32_layout.onednn_pack(self.layer.weight.detach(), self.rows)
                if self.release_plain:
                    self.layer.weight.data = torch.empty(0, dtype=self.layer.weight.dtype)
                    self.released = True
            return fp32_layout.onednn_linear(x, self.packed, self.bias)
        if rows != self.rows:  # MKL's packing is for one row count
            return self.original(x)
        out = torch.ops.mkl._mkl_linear(x.reshape(rows, -1), self.packed, self.weight, self.bias, rows)
        return out.reshape(*x.shape[:-1], out.shape[-1])


class OnednnOperand(NamedTuple):
    """Where a packed layer's outputs come from in a decoding pass: ``packed`` (its own
    weight, or the stacked weight of its set of siblings), ``bias`` (that product's), and
    the column where the layer's outputs start in the product (0 for a layer alone)."""

    packed: torch.Tensor
    bias: torch.Tensor | None
    start: int


def onednn_operand(module: nn.Module, rows: int) -> OnednnOperand | None:
    """The packed weight a no-grad decoding pass of ``rows`` rows through ``module`` runs
    on, for a caller that computes the product itself (the lean decoding step takes each
    set of siblings' stacked product once, without the layers' calls); None unless
    ``module`` is in oneDNN's fp32 format, already packed, with the format working and
    ``rows`` within what the packing serves (the caller then calls the layer)."""
    forward = module.__dict__.get("forward")
    if not isinstance(forward, _PackedForward) or forward.format != FP32_ONEDNN or FP32_ONEDNN in _broken:
        return None
    if rows > max(forward.rows, _ONEDNN_PACK_MAX_ROWS):  # such a pass runs plain (see _packed_call)
        return None
    if forward.siblings is not None:
        fused, index = forward.siblings
        return None if fused.packed is None else OnednnOperand(fused.packed, fused.bias, fused.starts[index])
    return None if forward.packed is None else OnednnOperand(forward.packed, forward.bias, 0)


def _switch_off(packed_format: str, exc: Exception) -> None:
    """A packing op failed on a real model: plain layers for ``packed_format`` from now on."""
    if packed_format not in _broken:
        _broken.add(packed_format)
        logger.warning(
            "pre-packed %s linear weights are off from now on, decoding uses the plain layers: %s: %s",
            packed_format,
            type(exc).__name__,
            exc,
        )


def _probe(packed_format: str) -> str | None:
    """Pack a small layer in ``packed_format`` and compare with ``F.linear``; None when they agree."""
    dtype = torch.bfloat16 if packed_format == BF16 else torch.float32
    if packed_format in (BF16, FP32_ONEDNN) and not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN"
    if packed_format == BF16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "this CPU has no oneDNN bf16 support"
    if packed_format == FP32_MKL and not getattr(torch._C, "has_mkl", False):
        return "this torch build has no MKL"
    gen = torch.Generator().manual_seed(0)
    layer = nn.Linear(64, 48)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(48, 64, generator=gen) / 8)
        layer.bias.copy_(torch.randn(48, generator=gen))
        x = torch.randn(3, 64, generator=gen)
        packed = _PackedForward(layer, packed_format, rows=3)._packed_call(x.to(dtype)).float()
        plain = nn.functional.linear(x.to(dtype), layer.weight.to(dtype), layer.bias.to(dtype)).float()
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    if packed.shape != plain.shape:
        return f"packed output shape {tuple(packed.shape)} differs from F.linear's {tuple(plain.shape)}"
    if not torch.allclose(packed, plain, atol=tolerance, rtol=tolerance):
        return f"packed results differ from F.linear by up to {(packed - plain).abs().max().item():.3g}"
    return None


@functools.cache
def unavailable_reason(packed_format: str) -> str | None:
    """None when packing in ``packed_format`` works in this process, else why not (probed
    once, logged once)."""
    try:
        with torch.autocast("cpu", enabled=False):  # the probe picks its dtype itself
            reason = _probe(packed_format)
    except Exception as exc:  # noqa: BLE001 - private ops: any failure means plain layers
        reason = f"{type(exc).__name__}: {exc}"
    if reason is not None:
        logger.info("pre-packed %s linear weights are off, decoding uses the plain layers: %s", packed_format, reason)
    return reason


def _available(packed_format: str) -> bool:
    return packed_format not in _broken and unavailable_reason(packed_format) is None


def _bf16_packing_available() -> bool:
    return _available(BF16)


def _fp32_packing_available() -> bool:
    return _available(FP32_MKL)


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
        return torch.float32 if _fp32_packing_available() or _available(FP32_ONEDNN) else None
    return None


def _replaceable(module: nn.Module, packed_format: str) -> TypeGuard[nn.Linear]:
    """A plain CPU linear layer of a packable dtype whose forward nobody else replaced."""
    if type(module) is not nn.Linear:
        return False
    # an instance-level forward is someone else's wrapper (accelerate's hook moves offloaded
    # weights in before calling the layer): replacing it would drop it. Both live in the
    # instance's __dict__ (accelerate sets _hf_hook as a plain attribute); reading it there,
    # and the weight from _parameters, skips nn.Module.__getattr__ (a LoRA team's block
    # asks this of ~1,000 linear layers a call)
    attributes = module.__dict__
    if "forward" in attributes or "_hf_hook" in attributes:
        return False
    weight = module._parameters.get("weight")
    return (
        weight is not None
        and weight.device.type == "cpu"
        and weight.dtype in ((torch.float32,) if packed_format != BF16 else (torch.float32, torch.bfloat16))
    )


def _big_enough(shape: tuple[int, ...], packed_format: str) -> bool:
    min_elements = FP32_MIN_WEIGHT_ELEMENTS if packed_format == FP32_MKL else _MIN_WEIGHT_ELEMENTS
    return shape[0] * shape[1] >= min_elements and (packed_format != FP32_ONEDNN or min(shape) >= _ONEDNN_MIN_SIDE)


def _packable(module: nn.Module, packed_format: str) -> TypeGuard[nn.Linear]:
    # the size first, from the layer's own attributes: it turns away a LoRA team's ~840
    # low-rank factors before the costlier checks
    attributes = module.__dict__
    shape = (attributes.get("out_features", 0), attributes.get("in_features", 0))
    return (
        _big_enough(shape, packed_format)
        and _replaceable(module, packed_format)
        and _big_enough(tuple(module.weight.shape), packed_format)
    )


# Packing a weight costs a pass over it (the SmolLM2 lm_head: ~157 ms on 2 cores, once per
# sampling call) and gains per decoding step only from a few rows on (Xeon, 1 row: none,
# packed was slower; 16 rows: ~3.7 ms a step). Below these, a call keeps the plain layers.
# The rule for bf16, and for fp32 weights too small to measure: fp32 MKL packing of a large
# weight is measured (fp32_layout.mkl_packing_pays; on an AMD EPYC it pays at 1 row).
MIN_PACKED_ROWS = 4
MIN_PACKED_ROW_TOKENS = 1024  # rows x new tokens of the call


def packing_pays(rows: int, new_tokens: int) -> bool:
    """Whether packing for a call of ``rows`` rows decoding ``new_tokens`` tokens each can
    win back its one-off cost."""
    return rows >= MIN_PACKED_ROWS and rows * new_tokens >= MIN_PACKED_ROW_TOKENS


def _packable_in(walk: ModelWalk, module: nn.Module, packed_format: str) -> bool:
    """:func:`_packable`, decided once per module and format for the call's walk."""
    return id(module) in walk.select(packed_format, lambda m: _packable(m, packed_format))


def onednn_units(model: nn.Module, walk: ModelWalk | None = None) -> tuple[list[list[nn.Linear]], list[nn.Linear]]:
    """What oneDNN's fp32 format packs, in model order: the sets of untied sibling layers
    that share one stacked weight (empty with ``FUSE_SIBLINGS`` off), and every other
    packable layer on its own. ``walk``: the call's walk of ``model``, if it has one."""
    walk = walk or ModelWalk(model)
    groups: list[list[nn.Linear]] = []
    if FUSE_SIBLINGS:
        uses = walk.uses
        candidates = sibling_groups(
            model, lambda m: _replaceable(m, FP32_ONEDNN) and uses[id(m.weight)] == 1, modules=walk.modules
        )
        groups = [g for g in candidates if _big_enough((sum(m.out_features for m in g), g[0].in_features), FP32_ONEDNN)]
    grouped = {id(m) for group in groups for m in group}
    singles = [m for m in walk.linears if id(m) not in grouped and _packable_in(walk, m, FP32_ONEDNN)]
    return groups, singles


class PackingPlan(NamedTuple):
    """How :func:`prepacked_linears` packs a model for one call."""

    format: str | None  # the packed format, or None (the plain layers)
    # oneDNN's format: the sibling sets stacked into one weight (the ones its measurement
    # timed stacked); empty for other formats
    sibling_sets: list[list[nn.Linear]]


def packing_plan(
    model: nn.Module, rows: int, new_tokens: int | None, walk: ModelWalk | None = None, few_row_kernel: bool = False
) -> PackingPlan:
    """The format :func:`prepacked_linears` packs ``model`` in for a call of ``rows`` rows
    and ``new_tokens`` tokens each, and for oneDNN's the sibling sets it stacks (found once
    a call). ``walk``: the call's walk of ``model``, if it has one. ``few_row_kernel``: the
    caller's decoding step runs fp32 products of up to ``row_products.MAX_ROWS`` rows on
    the plain weights through that kernel, so such a call packs nothing where it is on."""
    walk = walk or ModelWalk(model)
    dtype = packing_dtype(model)
    if dtype == torch.bfloat16:
        return PackingPlan(None if new_tokens is not None and not packing_pays(rows, new_tokens) else BF16, [])
    if dtype != torch.float32:
        return PackingPlan(None, [])
    if few_row_kernel and rows <= row_products.MAX_ROWS and row_products.kernel_status() == "on":
        return PackingPlan(None, [])
    # a forced MKL layout skips the oneDNN probe and the walk over the layers
    if fp32_layout.forced_layout() != "mkl" and _available(FP32_ONEDNN):
        # measured as it would run: each set of siblings as one stacked weight
        groups, singles = onednn_units(model, walk)
        first_of = {id(group[0]): group for group in groups}
        single_ids = {id(m) for m in singles}
        weights: list[torch.Tensor | tuple[torch.Tensor, ...]] = []
        for module in walk.linears:  # every packed layer is a plain linear
            if id(module) in first_of:
                weights.append(tuple(m.weight for m in first_of[id(module)]))
            elif id(module) in single_ids:
                weights.append(module.weight)
        if fp32_layout.layout_for(weights, rows, new_tokens) == "onednn":
            return PackingPlan(FP32_ONEDNN, groups)
    if not _fp32_packing_available():
        return PackingPlan(None, [])
    # MKL's copies of the large weights (the vocabulary projection): measured where they are
    # big enough to time, else the fixed rule
    large = [m.weight for m in walk.linears if _packable_in(walk, m, FP32_MKL)]
    pays = fp32_layout.mkl_packing_pays(large, rows, new_tokens)
    if pays is None:
        pays = new_tokens is None or packing_pays(rows, new_tokens)
    return PackingPlan(FP32_MKL if pays else None, [])


@contextlib.contextmanager
def prepacked_linears(
    model: nn.Module,
    rows: int,
    new_tokens: int | None = None,
    walk: ModelWalk | None = None,
    few_row_kernel: bool = False,
) -> Iterator[bool]:
    """Within the block, no-grad calls of ``model``'s linear layers use weights packed for
    ``rows`` input rows (the decoding batch). Yields whether packing is active. Call it
    inside the autocast region the passes run in (it decides the packing dtype).
    ``new_tokens`` (tokens each row will decode): pack only where it pays (fp32 on MKL:
    :func:`packing_pays`; fp32 on oneDNN: :func:`fp32_layout.layout_for`). ``walk``: the
    sampling call's walk of ``model``, if it has one (a new one otherwise).
    ``few_row_kernel``: see :func:`packing_plan`."""
    walk = walk or ModelWalk(model)
    packed_format, sibling_sets = packing_plan(model, rows, new_tokens, walk, few_row_kernel)
    patched: list[nn.Linear] = []
    try:
        if packed_format is not None:
            # a weight tied to another module (SmolLM2's lm_head and embeddings) keeps its
            # plain values beside the packed copy: the other module reads them
            uses = walk.uses
            fused: dict[int, tuple[nn.Linear, FusedSiblings, int]] = {}
            if packed_format == FP32_ONEDNN:
                for group in sibling_sets:
                    shared = FusedSiblings(group, rows)
                    fused.update({id(layer): (layer, shared, index) for index, layer in enumerate(group)})
            try:
                for module in walk.linears:  # every packed layer is a plain linear
                    sibling = fused.get(id(module))
                    if sibling is not None:
                        layer, shared, index = sibling
                        layer.__dict__["forward"] = _PackedForward(layer, packed_format, rows, siblings=(shared, index))
                        patched.append(layer)
                    elif _packable_in(walk, module, packed_format):
                        # an instance-level forward shadows nn.Linear.forward for this layer only
                        module.__dict__["forward"] = _PackedForward(
                            module, packed_format, rows, release_plain=uses[id(module.weight)] == 1
                        )
                        patched.append(module)
            except Exception as exc:  # noqa: BLE001 - private ops: fall back to the plain layers
                _switch_off(packed_format, exc)
                for module in patched:
                    del module.forward
                patched = []
        yield bool(patched)
    finally:
        failed: Exception | None = None
        for module in patched:
            try:
                module.__dict__["forward"].restore()
            except Exception as exc:  # noqa: BLE001 - the packed copy stays the layer's only copy
                failed = failed or exc
                continue
            del module.forward  # back to the class's forward
        if failed is not None:
            raise RuntimeError(
                "could not put the plain weights back after a oneDNN-packed call; the affected "
                "layers keep their packed copies (no-grad passes only). Set COMLRL_FP32_LAYOUT=mkl "
                f"to avoid the packed layout: {type(failed).__name__}: {failed}"
            ) from failed
