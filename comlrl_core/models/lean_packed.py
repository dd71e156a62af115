"""The lean decoding step's packed route: a layer computed straight from its packed weights.

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

Public API::

    packed_layer(layer, rows, adapter_names, in_call) -> PackedLayer | None
    packed_layer_step(layer, packed, hidden, cache_layer, shared, runs) -> hidden
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import torch
import torch.nn.functional as F

from comlrl_core.models.cpu import fp32_layout
from comlrl_core.models.cpu.packed_linear import OnednnOperand, onednn_operand
from comlrl_core.models.cpu.sibling_linears import base_linear
from comlrl_core.models.lean_ops import AdapterStack, StepRuns, StepShared, adapter_stack, attend, rms_norm


class Product(NamedTuple):
    """One product of a layer: its packed weight (alone or a set of siblings stacked) and
    the LoRA adapters added to it (None: none)."""

    weight: OnednnOperand
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
    products = []
    for operand, members in ((q, modules[:3]), (o, modules[3:4]), (gate, modules[4:6]), (down, modules[6:])):
        stackable, adapters = adapter_stack(members, adapter_names, torch.float32)
        if not stackable:
            return None
        products.append(Product(operand, adapters))
    return PackedLayer(*products)


def _product(x: torch.Tensor, product: Product, runs: StepRuns | None) -> torch.Tensor:
    """``x`` times the product's packed weight, plus its adapters' deltas (each row its own
    adapter's: the low-rank activations masked unless one adapter owns every row)."""
    out = fp32_layout.onednn_linear(x, product.weight.packed, product.weight.bias)
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
