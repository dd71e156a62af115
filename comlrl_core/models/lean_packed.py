"""The lean decoding step's direct routes: a layer computed straight from its packed
weights, or from its plain weights through the few-row kernel.

Once a sampling call's first decoding step has packed a layer's linear weights in oneDNN's
fp32 format (:mod:`comlrl_core.models.cpu.packed_linear`, q/k/v and gate/up each stacked
into one weight), :func:`packed_layer` hands the step the layer's four products (q/k/v, o,
gate/up, down) and the step runs them without the layers' module calls
(:func:`packed_layer_step`), rotating q's and k's heads, side by side in the stacked
product, in one pass. For a full model that is the same arithmetic as the route through
the modules, so the same logits bit for bit.

LoRA layers (vanilla adapters on the packed base layers, the agents of a shared base) take
the route inside a sampling call, where adapter weights cannot change: each product's
adapters are stacked once per call (:class:`~comlrl_core.models.lean_ops.AdapterStack`):
the A matrices of every adapter and sibling one above the other, adapter by adapter, and
the B matrices (transposed, times their scaling) in a block matrix whose columns are the
stacked product's. A set's deltas then cost two small products instead of two per sibling
and adapter (SmolLM2's 7 LoRA layers a decoder layer: 8 adapter products instead of 14),
and rows of several adapters mask the low-rank activations to their own adapter's block.
SmolLM2-135M, a LoRA agent of a two-agent team, AMD EPYC, 2 CPUs, 48 tokens from
280-token prompts, ms a decoding step through the modules -> here (medians of 6 calls,
taking turns): 91.4 -> 66.5 at one row, 158.3 -> 144.8 at 16 rows.
The sums are those of the route through the modules up to rounding (the scaling is folded
into B, and the adapters' products are grouped differently). An adapter with active
dropout or weights of another dtype keeps its layer on the modules' route, as does a call
without the packing, with gradients on, or a layer whose weights are not packed (yet).

At one to three rows (:data:`~comlrl_core.models.cpu.row_products.MAX_ROWS`), where the
sampler did not pack the layers, :func:`row_layer` hands the step the same four products on
the plain weights, each through :mod:`~comlrl_core.models.cpu.row_products`' kernel (q/k/v
and gate/up written side by side into one output), at the memory's rate: a batch-1
SmolLM2-135M step reads its 538 MB in ~18 ms against ~27 ms in oneDNN's packed kernels
(AMD EPYC, Zen 4), with no packing at the call's start. Sums agree with oneDNN's to rounding.

Public API::

    packed_layer(layer, rows, adapter_names, in_call) -> PackedLayer | None
    row_layer(layer, rows, adapter_names, in_call) -> PackedLayer | None  (plain weights, 1-3 rows)
    packed_layer_step(layer, packed, hidden, cache_layer, shared, runs) -> hidden
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import torch
import torch.nn.functional as F

from comlrl_core.models.cpu import fp32_layout, row_products
from comlrl_core.models.cpu.packed_linear import OnednnOperand, onednn_operand
from comlrl_core.models.cpu.row_products import RowOperand
from comlrl_core.models.cpu.sibling_linears import base_linear
from comlrl_core.models.lean_ops import AdapterStack, StepRuns, StepShared, adapter_stack, attend, rms_norm


class Product(NamedTuple):
    """One product of a layer: its packed weight (alone or a set of siblings stacked) or
    its plain weights for the few-row kernel, and the LoRA adapters added to it (None: none)."""

    weight: OnednnOperand | RowOperand
    adapters: AdapterStack | None


class PackedLayer(NamedTuple):
    """One decoder layer's packed products: q/k/v stacked, o, gate/up stacked, down."""

    qkv: Product
    o: Product
    gate_up: Product
    down: Product


def packed_layer(layer: Any, rows: int, adapter_names: Sequence[str] | None, in_call: bool) -> PackedLayer | None:
    """``layer``'s packed products for a pass of ``rows`` rows when its linear layers (a LoRA
    layer's base layers) are plain and packed in oneDNN's format, q/k/v (and gate/up) as one
    stacked weight in that order; else None (the layer goes through its modules). LoRA
    layers only ``in_call`` (their adapters are stacked once for the call), adding the
    adapters of ``adapter_names`` (the call's; None: each layer's active adapters). The
    step looks a layer up until it is found (the packing happens at the call's first
    decoding pass) and keeps it until the call ends (the packing is undone then)."""
    attn, mlp = layer.self_attn, layer.mlp
    modules = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    if not in_call and any(m is not base_linear(m) for m in modules):
        return None
    q, k, v, o, gate, up, down = (onednn_operand(base_linear(m), rows) for m in modules)
    if q is None or gate is None or q.start != 0 or gate.start != 0:
        return None
    if k is None or v is None or up is None or o is None or down is None:
        return None
    q_width, k_width = base_linear(attn.q_proj).out_features, base_linear(attn.k_proj).out_features
    stacked = k.packed is q.packed and v.packed is q.packed and k.start == q_width and v.start == q_width + k_width
    if not stacked or up.packed is not gate.packed or up.start != base_linear(mlp.gate_proj).out_features:
        return None
    if o.start != 0 or down.start != 0:
        return None
    return _with_adapters((q, o, gate, down), modules, adapter_names)


def row_layer(layer: Any, rows: int, adapter_names: Sequence[str] | None, in_call: bool) -> PackedLayer | None:
    """``layer``'s products on its plain fp32 weights through the few-row kernel, for a
    pass of ``rows`` rows (at most :data:`~comlrl_core.models.cpu.row_products.MAX_ROWS`)
    where the kernel is on and no linear layer of it is packed; else None. LoRA layers and
    ``adapter_names`` as in :func:`packed_layer`."""
    if rows > row_products.MAX_ROWS or row_products.kernel_status() != "on":
        return None
    attn, mlp = layer.self_attn, layer.mlp
    modules = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    if not in_call and any(m is not base_linear(m) for m in modules):
        return None
    bases = [base_linear(m) for m in modules]
    if any("forward" in base.__dict__ for base in bases):
        return None  # a packed (or otherwise replaced) layer
    weights = []
    for members in (bases[:3], bases[3:4], bases[4:6], bases[6:]):  # siblings side by side in one output
        biases = [None if b.bias is None else b.bias.detach() for b in members]
        operand = row_products.prepare([b.weight.detach() for b in members], biases)
        if operand is None:
            return None
        weights.append(operand)
    return _with_adapters(weights, modules, adapter_names)


def _with_adapters(
    weights: Sequence[OnednnOperand | RowOperand], modules: Sequence[Any], adapter_names: Sequence[str] | None
) -> PackedLayer | None:
    """The four products (q/k/v, o, gate/up, down) of a layer with ``modules`` (its seven
    linear layers in that order), each with its adapters stacked; None where an adapter
    cannot be stacked (the layer goes through its modules)."""
    products = []
    for weight, members in zip(weights, (modules[:3], modules[3:4], modules[4:6], modules[6:]), strict=True):
        stackable, adapters = adapter_stack(members, adapter_names, torch.float32)
        if not stackable:
            return None
        products.append(Product(weight, adapters))
    return PackedLayer(*products)


def _product(x: torch.Tensor, product: Product, runs: StepRuns | None) -> torch.Tensor:
    """``x`` times the product's packed weight, plus its adapters' deltas (each row its own
    adapter's: the low-rank activations masked unless one adapter owns every row)."""
    weight = product.weight
    if isinstance(weight, RowOperand):
        out = row_products.product(x, weight)
        if out is None:  # an input it does not take
            out = torch.cat([F.linear(x, w, b) for w, b in zip(weight.weights, weight.biases, strict=True)], dim=1)
    else:
        out = fp32_layout.onednn_linear(x, weight.packed, weight.bias)
    stack = product.adapters
    if stack is not None:
        low = F.linear(x, stack.down)  # [rows, sum r]
        if runs is not None and not runs.covers(stack.layout):
            low.mul_(runs.mask(stack.layout, x))
        out.addmm_(low, stack.up)
    return out


def packed_layer_step(
    layer: Any, packed: PackedLayer, hidden: torch.Tensor, cache_layer: Any, shared: StepShared, runs: StepRuns | None
) -> torch.Tensor:
    """One layer on its packed products: the stacked q/k/v product's columns as views,
    q's and k's heads (side by side in it) rotated in one pass."""
    attn, mlp = layer.self_attn, layer.mlp
    batch, head_dim = hidden.shape[0], attn.head_dim
    qkv = _product(rms_norm(hidden, layer.input_layernorm), packed.qkv, runs)
    q_width, k_width = base_linear(attn.q_proj).out_features, base_linear(attn.k_proj).out_features
    rotated = qkv[:, : q_width + k_width].view(batch, -1, head_dim)
    rotated = torch.addcmul(rotated * shared.cos, rotated.roll(shared.half, dims=-1), shared.signed_sin)
    q_heads = q_width // head_dim
    v = qkv[:, q_width + k_width :].view(batch, -1, head_dim)
    attended = attend(attn, rotated[:, :q_heads], rotated[:, q_heads:], v, cache_layer, shared)
    hidden = hidden + _product(attended, packed.o, runs)
    normed = rms_norm(hidden, layer.post_attention_layernorm)
    gate_up = _product(normed, packed.gate_up, runs)
    width = base_linear(mlp.gate_proj).out_features
    gated = F.silu(gate_up[:, :width]) * gate_up[:, width:]
    return hidden + _product(gated, packed.down, runs)
