"""One decoding step of a Llama-family model without transformers' module machinery.

A decoding step feeds one token per row through every layer. transformers' forward spends
part of that step outside the arithmetic: building a 4-D mask, keyword plumbing through
decorators and hooks of ~30 layers, a module call per linear layer, norm and LoRA branch.
:class:`LeanDecoder` runs the same arithmetic (RMSNorm with fp32 statistics, rotary
embeddings from the model's own rotary module, grouped-query attention, SiLU-gated MLP,
LoRA deltas per row slice), straight on the weights, writing keys and values into the
sampler's preallocated cache (:mod:`comlrl_core.models.kv_cache`). Measured on
SmolLM2-135M, 2 Xeon cores, fp32, a decoding step from a 280-token prompt (transformers'
forward -> lean): 38 -> 33 ms at batch 1, 96 -> 86 ms at batch 16, and 48 -> 38 ms at
batch 1 for a LoRA agent (the module calls of its 210 adapter branches).

It covers what it can check and nothing else: ``LlamaForCausalLM`` (SmolLM2, Llama and the
tiny test model), optionally wrapped by peft with vanilla LoRA adapters on linear layers,
no autocast, every cache layer preallocated with room left. Anything else returns None
and the caller runs the model's own forward. Each model is probed once, on its first
decoding step: the lean step and the model's forward compute the same step from the same
cache, and where their logits differ beyond rounding the model keeps transformers' path for
good (one WARNING naming the difference).

A batch with rows of several adapters (agents of one shared base): between
``start_call()`` and ``end_call()`` (one sampling call, whose adapter weights cannot change)
each LoRA layer stacks its adapters once, A matrices one above the other and B matrices
(times their scaling) side by side, and a step runs all of them in two products, the
low-rank activations masked per row to the row's own adapter. Two adapters on SmolLM2's
210 LoRA layers: 421 products a step instead of 1,051 (4 rows: 67.8 -> 48.3 ms a step).
Outside a call, with one adapter, active dropout or another dtype, each run of rows goes
through its adapter on a row slice.

Layers whose linear weights run in oneDNN's packed fp32 format
(:mod:`comlrl_core.models.cpu.packed_linear`) skip their module calls once packed (the
call's first decoding step packs): :mod:`comlrl_core.models.lean_packed` takes each
layer's stacked q/k/v and gate/up products straight from the packed weights, a LoRA
layer's adapters stacked per product for the call; for a full model the same logits bit
for bit. SmolLM2-135M, AMD EPYC, 2 CPUs, 48 tokens from 280-token prompts, decoding ms a
step through the modules -> straight (full model, medians of 8 calls each, taking turns):
53.4 -> 50.7 and 57.2 -> 54.5 at one row, 96.0 -> 94.9 and 102.0 -> 101.4 at 16 rows.
The arithmetic both routes share is in :mod:`comlrl_core.models.lean_ops`.

Public API::

    lean_decoder(model) -> LeanDecoder | None  (None: unsupported, with why in unsupported_reason)
    LeanDecoder.start_call() / end_call()  (around one sampling call: adapters stacked, packed layers kept, in between)
    LeanDecoder.step(ids [B, 1], mask [B, L], positions [B, 1], cache, adapter_names) -> logits [B, V] | None
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from comlrl_core.models.cpu.model_walk import module_tree
from comlrl_core.models.cpu.row_products import MAX_ROWS, row_product
from comlrl_core.models.lean_lora import is_vanilla_lora_linear
from comlrl_core.models.lean_ops import (
    AdapterStack,
    StepRuns,
    StepShared,
    adapter_stack,
    attend,
    dropout_active,
    rms_norm,
)
from comlrl_core.models.lean_packed import PackedLayer, packed_layer, packed_layer_step, row_layer
from comlrl_core.models.lora import transformers_model
from comlrl_core.models.mixed_adapters import adapter_runs

logger = logging.getLogger(__name__)

_ATTRIBUTE = "_comlrl_lean_decoder"  # per model instance: the decoder, or the reason there is none
# max |lean - transformers| of the probe's logits, relative to the logits' scale
PROBE_TOLERANCE = 1e-3


def _unsupported_linear(module: Any) -> str | None:
    """None when the lean step can compute ``module`` itself (a plain linear, or a vanilla
    LoRA linear over one), else why not."""
    if type(module) is nn.Linear:
        return None
    if not is_vanilla_lora_linear(module):
        return f"a {type(module).__name__} layer (not a plain or vanilla LoRA linear)"
    if getattr(module, "lora_magnitude_vector", None):
        return "a LoRA layer with DoRA"
    base_layer = getattr(module, "base_layer", None)
    if type(base_layer) is not nn.Linear:
        return f"a LoRA layer over {type(base_layer).__name__}"
    return None


def _check_model(model: nn.Module) -> tuple[Any, str | None]:
    """(the transformers model, None) when supported, else (..., why not)."""
    base = transformers_model(model)  # a transformers model: attributes checked below
    if type(base).__name__ != "LlamaForCausalLM":
        return base, f"{type(base).__name__} is not LlamaForCausalLM"
    config = base.config
    if getattr(config, "pretraining_tp", 1) not in (1, None):
        return base, "pretraining_tp > 1"
    if getattr(config, "hidden_act", "silu") != "silu":
        return base, f"hidden_act {config.hidden_act!r}"
    inner = base.model
    if type(inner.embed_tokens) is not nn.Embedding:
        return base, f"input embeddings are a {type(inner.embed_tokens).__name__}"
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        names = {"q_proj": attn.q_proj, "k_proj": attn.k_proj, "v_proj": attn.v_proj, "o_proj": attn.o_proj}
        names.update(gate_proj=mlp.gate_proj, up_proj=mlp.up_proj, down_proj=mlp.down_proj)
        for name, module in names.items():
            reason = _unsupported_linear(module)
            if reason is not None:
                return base, f"{name} is {reason}"
            if module._forward_hooks or module._forward_pre_hooks or "_hf_hook" in module.__dict__:
                return base, f"{name} carries hooks"
    reason = _unsupported_linear(base.get_output_embeddings())
    if reason is not None:
        return base, f"the output layer is {reason}"
    return base, None


class LeanDecoder:
    """The decoding step of one ``LlamaForCausalLM`` (see the module docstring)."""

    def __init__(self, base: Any) -> None:
        self.inner: Any = base.model
        self.layers: list[Any] = list(self.inner.layers)
        self.head: Any = base.get_output_embeddings()
        self.checked = False  # the probe has compared one step with transformers' forward
        # per sampling call (start_call .. end_call): the adapters' order and each LoRA
        # layer's stacked adapters (row masks are per step: StepRuns)
        self._in_call = False
        self._call_adapters: tuple[str, ...] | None = None
        self._stacks: dict[int, AdapterStack | None] = {}
        # per sampling call: the layers found packed (oneDNN) so far, or on their plain
        # weights through the few-row kernel, by index; the packing lasts until the call
        # ends, and rows only leave a call (a few-row layer stays few-row)
        self._packed_layers: dict[int, PackedLayer] = {}

    # ------------------------------------------------------------------ sampling calls
    def start_call(self) -> None:
        """A sampling call begins: adapter weights are fixed until :meth:`end_call`, so each
        LoRA layer's adapters may be stacked once for all its steps."""
        self.end_call()
        self._in_call = True

    def end_call(self) -> None:
        """The call is over: drop the stacked copies (the weights may change after it)."""
        self._in_call = False
        self._call_adapters = None
        self._stacks.clear()
        self._packed_layers.clear()

    def _stacked(self, module: Any, dtype: torch.dtype) -> AdapterStack | None:
        """``module``'s adapters of this call stacked (None: not stackable: dropout active or
        another dtype; those layers take the per-run path)."""
        key = id(module)
        if key in self._stacks:
            return self._stacks[key]
        _, stack = adapter_stack([module], self._call_adapters or (), dtype)  # scaling folded into B
        self._stacks[key] = stack
        return stack

    # ------------------------------------------------------------------ linear layers
    def _linear(self, module: Any, x: torch.Tensor, step_runs: StepRuns | None) -> torch.Tensor:
        if type(module) is nn.Linear:
            if "forward" in module.__dict__:  # a packed or otherwise replaced forward: keep it
                return module(x)
            return F.linear(x, module.weight, module.bias)
        base_layer = module.base_layer
        result = base_layer(x) if "forward" in base_layer.__dict__ else F.linear(x, base_layer.weight, base_layer.bias)
        if module.disable_adapters:
            return result
        rows_in = x.shape[0]
        if step_runs is None:  # every row through the active adapters, as peft's forward does
            runs: Sequence[tuple[str, int, int]] = [(name, 0, rows_in) for name in module.active_adapters]
        else:
            runs = step_runs.runs
            if len(runs) > 1 and self._in_call:
                # several adapters in the batch: all of them in two products (rows masked to
                # their own adapter's block) instead of two per run on row slices
                stack = self._stacked(module, x.dtype)
                if stack is not None:
                    low = F.linear(x, stack.down)  # [rows, sum r]
                    low.mul_(step_runs.mask(stack.layout, x))
                    return result.addmm_(low, stack.up)
        for name, start, stop in runs:
            if name not in module.lora_A:
                continue
            lora_a, lora_b = module.lora_A[name].weight, module.lora_B[name].weight
            whole = start == 0 and stop == rows_in  # one adapter for the batch: no slicing
            rows = x if whole else x[start:stop]
            if rows.dtype != lora_a.dtype:
                rows = rows.to(lora_a.dtype)  # peft runs adapters in their own dtype
            dropout = module.lora_dropout[name]
            if dropout_active(dropout):
                rows = dropout(rows)
            low = F.linear(rows, lora_a)  # [rows, r]
            target = result if whole else result[start:stop]
            if lora_b.dtype == result.dtype:  # scaled product added in place: one op
                target.addmm_(low, lora_b.t(), alpha=module.scaling[name])
            else:
                target += (F.linear(low, lora_b) * module.scaling[name]).to(result.dtype)
        return result

    # ------------------------------------------------------------------ the step
    @staticmethod
    def cache_ready(cache: Any, layers: int) -> bool:
        """Every layer preallocated (the sampler's in-place cache) with room for one more token."""
        cache_layers = getattr(cache, "layers", None)
        if not isinstance(cache_layers, list) or len(cache_layers) != layers:
            return False
        return all(hasattr(layer, "room") and layer.room() > 0 for layer in cache_layers)

    def step(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        adapter_names: Sequence[str] | None,
    ) -> torch.Tensor | None:
        """Logits ``[B, V]`` (fp32) of the next token after ``ids [B, 1]``; the cache gains
        that token's keys and values. None when the cache is not ready (nothing changed)."""
        if torch.is_autocast_enabled(ids.device.type) or not self.cache_ready(cache, len(self.layers)):
            return None
        runs = StepRuns(adapter_runs(adapter_names)) if adapter_names is not None else None
        if runs is not None and self._in_call:
            known = self._call_adapters or ()
            if any(name not in known for name, _, _ in runs.runs):  # the first step (rows only leave later)
                self._call_adapters = tuple(dict.fromkeys([*known, *(name for name, _, _ in runs.runs)]))
                self._stacks.clear()
                self._packed_layers.clear()  # their adapter stacks lack the new adapter
        inner = self.inner
        hidden = inner.embed_tokens(ids)[:, 0]  # [B, H]; the module call keeps its hooks (benchmarks time from there)
        batch = hidden.shape[0]
        cos, sin = inner.rotary_emb(hidden[:, None, :], positions)  # [B, 1, D]
        half = cos.shape[-1] // 2
        # rotate_half(x) * sin == roll(x, half) * [-sin_1, sin_2]: one roll instead of slices and a cat
        signed_sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        first = cache.layers[0]
        kv_heads, length = first.keys.shape[1], first.keys.shape[-2] + 1
        # additive mask per (row, key/value head): [B * Hkv, 1, L], -inf at left padding
        bias = torch.zeros(mask.shape, dtype=hidden.dtype, device=hidden.device).masked_fill_(mask == 0, float("-inf"))
        bias = bias[:, None, None, :].expand(batch, kv_heads, 1, length).reshape(batch * kv_heads, 1, length)
        shared = StepShared(cos, signed_sin, half, bias, kv_heads, length)
        # layers packed in oneDNN's format: each set of siblings' stacked product taken once,
        # straight from the packed weights, LoRA adapters stacked per product (no gradients)
        direct = hidden.dtype == torch.float32 and not torch.is_grad_enabled()
        call_adapters = self._call_adapters if runs is not None else None
        found = self._packed_layers
        for index, (layer, cache_layer) in enumerate(zip(self.layers, cache.layers, strict=True)):
            packed = None
            if direct:
                packed = found.get(index) or packed_layer(layer, batch, call_adapters, self._in_call)
                if packed is None and batch <= MAX_ROWS:
                    packed = row_layer(layer, batch, call_adapters, self._in_call)
            if packed is not None:
                if self._in_call:
                    found[index] = packed
                hidden = packed_layer_step(layer, packed, hidden, cache_layer, shared, runs)
                continue
            attn = layer.self_attn
            normed = rms_norm(hidden, layer.input_layernorm)
            head_dim = attn.head_dim
            q = self._linear(attn.q_proj, normed, runs).view(batch, -1, head_dim)
            k = self._linear(attn.k_proj, normed, runs).view(batch, -1, head_dim)
            v = self._linear(attn.v_proj, normed, runs).view(batch, -1, head_dim)
            q = torch.addcmul(q * cos, q.roll(half, dims=-1), signed_sin)
            k = torch.addcmul(k * cos, k.roll(half, dims=-1), signed_sin)
            attended = attend(attn, q, k, v, cache_layer, shared)
            hidden = hidden + self._linear(attn.o_proj, attended, runs)
            mlp = layer.mlp
            normed = rms_norm(hidden, layer.post_attention_layernorm)
            gate = self._linear(mlp.gate_proj, normed, runs)
            up = self._linear(mlp.up_proj, normed, runs)
            hidden = hidden + self._linear(mlp.down_proj, F.silu(gate) * up, runs)
        hidden = rms_norm(hidden, inner.norm)
        head = self.head
        if type(head) is nn.Linear:
            logits = None
            if direct and batch <= MAX_ROWS and "forward" not in head.__dict__:
                logits = row_product(hidden, head.weight, head.bias)  # None: the kernel is off
            if logits is None:
                logits = head(hidden)  # the module: a packed forward may be installed on it
        else:
            logits = self._linear(head, hidden, runs)
        return logits.float()


def lean_decoder(model: nn.Module) -> LeanDecoder | None:
    """The model's lean decoder, built once per model instance; None when unsupported."""
    found = model.__dict__.get(_ATTRIBUTE)
    if isinstance(found, str):
        return None
    if isinstance(found, LeanDecoder):
        return None if _hooked(model, found) else found
    try:
        base, reason = _check_model(model)
    except AttributeError as exc:  # a Llama-named class without the usual attributes
        base, reason = model, f"unexpected layout: {exc}"
    if reason is not None:
        model.__dict__[_ATTRIBUTE] = reason
        logger.debug("lean decoding step off for %s: %s", type(model).__name__, reason)
        return None
    decoder = LeanDecoder(base)
    model.__dict__[_ATTRIBUTE] = decoder
    return None if _hooked(model, decoder) else decoder


def _hooked(model: nn.Module, decoder: LeanDecoder) -> bool:
    """Whether a forward hook would be skipped by the lean step (a hook on the model, a
    layer or a sub-layer: logits processors, probes, offloading). Hooks on the input
    embeddings run: the lean step calls that module."""
    embeddings = decoder.inner.embed_tokens
    for module in module_tree(model):  # asked every call: the fast walk (a LoRA team: ~3,100 modules)
        if module is not embeddings and (module._forward_hooks or module._forward_pre_hooks):
            return True
    return False


def unsupported_reason(model: nn.Module) -> str | None:
    """Why :func:`lean_decoder` gave None for ``model`` (None: it is supported or not yet asked)."""
    found = model.__dict__.get(_ATTRIBUTE)
    return found if isinstance(found, str) else None


def probe_step(
    decoder: LeanDecoder, model: nn.Module, reference_forward: Callable[[Any], torch.Tensor], *step_args: Any
) -> torch.Tensor | None:
    """The model's first lean step, checked: the lean step, then the same step through
    ``reference_forward(cache) -> logits`` (transformers) from the same cache. Returns the
    reference logits (the cache then holds the reference's keys/values); on a mismatch the
    model keeps transformers' path from now on."""
    lean = decoder.step(*step_args)  # (ids, mask, positions, cache, adapter_names) as for LeanDecoder.step
    if lean is None:
        return None
    cache = step_args[3]
    for layer in cache.layers:
        layer.drop_newest()  # the reference recomputes the same token from the same cache
    reference = reference_forward(cache)
    scale = reference.abs().max().clamp(min=1.0)
    gap = float((lean - reference).abs().max() / scale)
    decoder.checked = True
    if not gap <= PROBE_TOLERANCE:  # also catches NaN
        reason = f"its logits differ from transformers' forward by {gap:.2e} (relative)"
        model.__dict__[_ATTRIBUTE] = reason
        name = type(model).__name__
        logger.warning("lean decoding step off for %s, decoding keeps transformers' forward: %s", name, reason)
    return reference
