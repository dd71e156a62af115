"""Sibling linear layers that read one input, packed as one oneDNN weight.

A Llama-family attention computes ``q_proj(h)``, ``k_proj(h)`` and ``v_proj(h)`` from the
same ``h``, and its MLP ``gate_proj(x)`` and ``up_proj(x)`` from the same ``x``. In a
decoding step each of those products has a few rows, and on a CPU such a product costs a
kernel call, a thread fork and join, and a pass over its weight, whatever its width. One
product with the siblings' weights stacked does the same arithmetic in one call: on
SmolLM2-135M (AMD EPYC, 2 threads, oneDNN-packed fp32, all 30 layers) a pass over the layer
weights took 23.7 -> 19.8 ms at 1 row, 28.4 -> 24.2 ms at 4 rows and 45.7 -> 40.5 ms at 16
rows (medians of 15 turns; plain MKL: 26.6, 53.0, 70.1 ms).

:class:`FusedSiblings` holds that stacked weight for one set of siblings while a
``prepacked_linears`` block runs in oneDNN's fp32 format (``packed_linear``). Each sibling
keeps its own module and is still called on its own (by transformers' forward or by the
lean decoding step); the first sibling called with an input computes the stacked product
and the others called with the SAME tensor (same object, unmodified since) take their
columns of it. So the fusion changes no caller, and a caller that feeds the siblings
different inputs still gets the right values (it pays one stacked product per call).
Each sibling is served once per product: a second call of the same sibling with the same
input computes afresh (the caller may have changed its first result in place).

The columns handed out in a decoding pass are views of the stacked output (rows of the
stacked width): the parents where siblings are fused (:data:`FUSED_PARENTS`) only split
their last dimension or compute out of place, which views allow. Only the classes named
there are fused, so no other model meets such views.

While packed, the stacked copy is the siblings' only copy: their plain weights are released,
as ``packed_linear`` does for a single layer, and come back (split from the stacked copy,
an exact reordering) when the block ends or a pass needs the plain layers.

Public API::

    sibling_groups(model, can_fuse, modules=None) -> list[list[nn.Linear]]
    base_linear(module) -> a LoRA wrapper's base layer, else the module
    FusedSiblings(layers, rows)  (rows: the decoding rows the stacked weight is packed for)
        .output(index, x, decoding) -> sibling ``index``'s output for ``x``
        .restore()  (the plain weights back)
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from comlrl_core.models.cpu import fp32_layout

# the parent classes whose sibling projections are fused, and the siblings' attribute
# names: transformers' Llama, Mistral, Qwen2 and Qwen3 attention and MLP modules call each
# sibling once with the same tensor and only split the result's last dimension
_ATTENTION_SIBLINGS = ("q_proj", "k_proj", "v_proj")
_MLP_SIBLINGS = ("gate_proj", "up_proj")
FUSED_PARENTS: dict[str, tuple[str, ...]] = {
    **{f"{family}Attention": _ATTENTION_SIBLINGS for family in ("Llama", "Mistral", "Qwen2", "Qwen3")},
    **{f"{family}MLP": _MLP_SIBLINGS for family in ("Llama", "Mistral", "Qwen2", "Qwen3")},
}


def base_linear(module: Any) -> Any:
    """A (peft) LoRA wrapper's base layer, which it calls with its own input; else the module."""
    base = getattr(module, "base_layer", None)
    return base if isinstance(base, nn.Module) else module


def sibling_groups(
    model: nn.Module, can_fuse: Callable[[nn.Module], bool], modules: Iterable[nn.Module] | None = None
) -> list[list[nn.Linear]]:
    """The sets of sibling linear layers in ``model`` that may share one packed weight: under
    a parent of :data:`FUSED_PARENTS`, every sibling (or a LoRA wrapper's base layer) a
    plain linear for which ``can_fuse`` holds, all with one input width, dtype and bias
    presence. ``modules``: ``model.modules()`` already listed by the caller."""
    groups: list[list[nn.Linear]] = []
    for parent in modules if modules is not None else model.modules():
        names = FUSED_PARENTS.get(type(parent).__name__)
        if names is None:
            continue
        members = [base_linear(getattr(parent, name, None)) for name in names]
        if not all(isinstance(m, nn.Linear) and can_fuse(m) for m in members):
            continue
        layers = [m for m in members if isinstance(m, nn.Linear)]
        alike = len({(m.in_features, m.weight.dtype, m.bias is None) for m in layers}) == 1
        if alike and len({id(m) for m in layers}) == len(layers):
            groups.append(layers)
    return groups


def _version(x: torch.Tensor) -> int:
    """``x``'s version counter (bumped by every in-place change). Tensors made under
    ``torch.inference_mode`` keep none: for them the identity and the served set decide
    (the callers never change a sibling's input in place)."""
    return -2 if x.is_inference() else x._version


class FusedSiblings:
    """One set of siblings' stacked, oneDNN-packed weight (see the module docstring)."""

    def __init__(self, layers: Sequence[nn.Linear], rows: int) -> None:
        self.layers = list(layers)
        self.sizes = [layer.out_features for layer in self.layers]
        self.starts = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.rows = rows
        self.packed: torch.Tensor | None = None  # packed at the first decoding pass
        self.bias: torch.Tensor | None = None
        self.released = False
        # the last stacked product: its input (held, so its identity stays unique), the
        # input's version counter then, the output, and the siblings already served
        self._input: torch.Tensor | None = None
        self._version = -1
        self._output: torch.Tensor | None = None
        self._served: set[int] = set()

    def _pack(self) -> None:
        with torch.no_grad():
            weights = [layer.weight.detach() for layer in self.layers]
            self.packed = fp32_layout.onednn_pack(torch.cat(weights), self.rows)
            if self.layers[0].bias is not None:
                self.bias = torch.cat([layer.bias.detach() for layer in self.layers])
        for layer in self.layers:  # the stacked copy is the only one until restore()
            layer.weight.data = torch.empty(0, dtype=layer.weight.dtype)
        self.released = True

    def output(self, index: int, x: torch.Tensor, decoding: bool) -> torch.Tensor:
        """Sibling ``index``'s output for ``x``: its columns of the stacked product, computed
        when ``x`` is not the input of the last one or this sibling already had its share.
        ``decoding``: a decoding pass (packs at the first; the columns come as views); else
        a prefill pass after the packing (the plain stacked weight, rebuilt for the pass)."""
        fresh = self._input is not x or self._version != _version(x) or index in self._served
        if fresh:
            if decoding:
                if self.packed is None:
                    self._pack()
                assert self.packed is not None
                out = fp32_layout.onednn_linear(x, self.packed, self.bias)
            else:
                assert self.packed is not None, "a prefill pass before the packing runs the plain layers"
                out = F.linear(x, self.packed.to_dense(), self.bias)
            self._input, self._version, self._output, self._served = x, _version(x), out, set()
        assert self._output is not None
        self._served.add(index)
        start = self.starts[index]
        columns = self._output[..., start : start + self.sizes[index]]
        if len(self._served) == len(self.layers):  # every sibling served: let the tensors go
            self._input = self._output = None
        return columns if decoding else columns.contiguous()

    def restore(self) -> None:
        """Put the siblings' plain weights back (split from the stacked copy)."""
        self._input = self._output = None
        if self.released:
            assert self.packed is not None
            # outside inference mode even when the call ran in it (an inference tensor as a
            # weight would break every later training pass)
            with torch.no_grad(), torch.inference_mode(False):
                stacked = self.packed.to_dense()
                for layer, start, size in zip(self.layers, self.starts, self.sizes, strict=True):
                    layer.weight.data = stacked[start : start + size].clone()
            self.released = False
