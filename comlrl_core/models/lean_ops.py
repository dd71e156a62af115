"""The arithmetic pieces of the lean decoding step (:mod:`comlrl_core.models.lean_decode`)
that both of its routes use: through the layers' modules, and straight from packed weights
(:mod:`comlrl_core.models.lean_packed`).

Public API::

    StepShared(cos, signed_sin, half, bias, kv_heads, length)  (what every layer of a step reads)
    attend(attn, q, k, v, cache_layer, shared) -> [B, H * D]  (cpu.decode_attention's kernel where it runs)
    rms_norm(x, norm) -> x normalised as LlamaRMSNorm does
    StepRuns(runs).mask(layout, x) / .covers(layout)  (rows per adapter in one step)
    AdapterStack(down, up, layout)  (LoRA adapters side by side: two products for all of them)
    adapter_stack(modules, names, dtype) -> (stackable, AdapterStack | None)
    plain_adapter(module, name, dtype) / dropout_active(dropout)
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import torch
from torch import nn

from comlrl_core.models.cpu.decode_attention import decode_attention, torch_attention
from comlrl_core.models.cpu.sibling_linears import base_linear


class StepShared(NamedTuple):
    """What every layer of one step reads: the rotary factors (``cos``, and ``signed_sin``
    for the rolled half), the additive attention mask ``bias [B * Hkv, 1, L]``, the key/value
    heads and the cache length after this token."""

    cos: torch.Tensor
    signed_sin: torch.Tensor
    half: int
    bias: torch.Tensor
    kv_heads: int
    length: int


def attend(
    attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_layer: Any, shared: StepShared
) -> torch.Tensor:
    """Grouped-query attention of the rotated ``q [B, H, D]`` over the cache after writing
    ``k``, ``v [B, Hkv, D]`` into it (in place): ``[B, H * D]``."""
    batch, head_dim, length = q.shape[0], q.shape[-1], shared.length
    keys, values = cache_layer.update(k[:, :, None], v[:, :, None])  # written in place: [B, Hkv, L, D]
    # query head h reads key/value head h // groups: [B * Hkv, groups, D]
    grouped = q.reshape(batch * shared.kv_heads, -1, head_dim)
    keys = keys.reshape(batch * shared.kv_heads, length, head_dim)  # views of the cache buffer
    values = values.reshape(batch * shared.kv_heads, length, head_dim)
    mixed = decode_attention(grouped, keys, values, shared.bias, attn.scaling)  # compiled loops, where they run
    if mixed is None:
        mixed = torch_attention(grouped, keys, values, shared.bias, attn.scaling)
    return mixed.view(batch, -1)


class StepRuns:
    """One step's runs of rows per adapter, and its row masks (one per layout; local to
    the step, so concurrent calls on one model never see each other's)."""

    def __init__(self, runs: Sequence[tuple[str, int, int]]) -> None:
        self.runs = runs
        self._masks: dict[tuple[tuple[str, int], ...], torch.Tensor] = {}

    def mask(self, layout: tuple[tuple[str, int], ...], x: torch.Tensor) -> torch.Tensor:
        """``[rows, sum r]``: 1 where a row's adapter owns the column's block, else 0."""
        mask = self._masks.get(layout)
        if mask is None:
            mask = torch.zeros(x.shape[0], sum(r for _, r in layout), dtype=x.dtype, device=x.device)
            offsets, column = {}, 0
            for name, r in layout:
                offsets[name] = (column, column + r)
                column += r
            for name, start, stop in self.runs:
                if name in offsets:
                    first, last = offsets[name]
                    mask[start:stop, first:last] = 1
            self._masks[layout] = mask
        return mask

    def covers(self, layout: tuple[tuple[str, int], ...]) -> bool:
        """Whether every row of the step belongs to the layout's only adapter (no mask needed)."""
        return len(self.runs) == 1 and len(layout) == 1 and self.runs[0][0] == layout[0][0]


class AdapterStack(NamedTuple):
    """LoRA adapters of a call side by side, so that all of them cost two products:
    ``down`` ``[sum r, in]`` (the A matrices one above the other), ``up`` ``[sum r, out]``
    (the B matrices transposed, times each scaling; for a set of sibling layers stacked
    into one product, each B in its sibling's columns and zero elsewhere), and ``layout``:
    which adapter owns which block of columns of ``x @ down.T``, in order."""

    down: torch.Tensor
    up: torch.Tensor
    layout: tuple[tuple[str, int], ...]


def adapters_of(module: Any, names: Sequence[str] | None) -> list[str]:
    """The adapters ``module`` adds in this call: of ``names`` (the call's adapters, rows
    assigned per step) those it has, or with ``names`` None its active adapters (every row)."""
    if module is base_linear(module) or module.disable_adapters:
        return []
    if names is None:
        return [name for name in module.active_adapters if name in module.lora_A]
    return [name for name in names if name in module.lora_A]


def adapter_stack(
    modules: Sequence[Any], names: Sequence[str] | None, dtype: torch.dtype
) -> tuple[bool, AdapterStack | None]:
    """(stackable, the stack) of the adapters on ``modules``: one LoRA layer, or siblings
    whose outputs lie side by side in one product. (True, None): no adapters; (False, None):
    an adapter that must keep the per-run route (active dropout, weights not in ``dtype``)."""
    widths = [base_linear(m).out_features for m in modules]
    starts = [sum(widths[:i]) for i in range(len(widths))]
    used = [adapters_of(m, names) for m in modules]
    pairs = [(m, name) for m, names_of in zip(modules, used, strict=True) for name in names_of]
    if not all(plain_adapter(m, name, dtype) for m, name in pairs):
        return False, None  # checked before any stacking (the packed route asks at every step)
    order = list(dict.fromkeys(name for names_of in used for name in names_of))
    downs: list[torch.Tensor] = []
    blocks: list[tuple[int, int, torch.Tensor]] = []  # (first row, first column, B^T * scaling)
    layout: list[tuple[str, int]] = []
    row = 0
    with torch.no_grad():
        for name in order:
            first = row
            for module, start, names_of in zip(modules, starts, used, strict=True):
                if name not in names_of:
                    continue
                down = module.lora_A[name].weight.detach()
                downs.append(down)
                blocks.append((row, start, module.lora_B[name].weight.detach().t() * module.scaling[name]))
                row += down.shape[0]
            layout.append((name, row - first))
        if not downs:
            return True, None
        stacked_down = torch.cat(downs)
        up = stacked_down.new_zeros(row, sum(widths))
        for first_row, start, block in blocks:
            up[first_row : first_row + block.shape[0], start : start + block.shape[1]] = block
    return True, AdapterStack(stacked_down, up, tuple(layout))


def plain_adapter(module: Any, name: str, dtype: torch.dtype) -> bool:
    """Adapter ``name`` of ``module`` computes ``B(A(x)) * scaling`` on ``dtype`` inputs
    (no active dropout, its weights in that dtype)."""
    if dropout_active(module.lora_dropout[name]):
        return False
    return module.lora_A[name].weight.dtype == dtype and module.lora_B[name].weight.dtype == dtype


def dropout_active(dropout: nn.Module) -> bool:
    """Whether a LoRA dropout module changes its input (training mode, ``p > 0``)."""
    return not isinstance(dropout, nn.Identity) and dropout.training and getattr(dropout, "p", 0) > 0


def rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    # LlamaRMSNorm's arithmetic: fp32 statistics, weight applied in the input dtype
    # (torch's F.rms_norm is slower here on CPU: ~50 us a call at one row, a composite op)
    dtype = x.dtype
    x32 = x if dtype == torch.float32 else x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * (x32 if dtype == torch.float32 else x32.to(dtype))
