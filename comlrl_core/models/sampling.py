"""Batched autoregressive sampling driven by a private ``torch.Generator``.

Why not ``model.generate``: in transformers 5 it samples with the global RNG
(``torch.multinomial`` without a generator), so a seed could only be honoured by
re-seeding global state. This loop is the same algorithm (KV cache, left padding,
temperature -> top-k -> top-p, multinomial) with the generator passed explicitly, so
a given seed gives the same samples whatever the global RNG state.

Public API::

    sample_tokens(model, input_ids, attention_mask, *, max_new_tokens, temperature=1.0,
                  top_p=1.0, top_k=0, eos_token_ids, pad_token_id, generator=None,
                  num_samples=1)
        -> SampleOutput(tokens [B * num_samples, T], lengths [...], stopped_on_eos [...])
    repeat_cache_rows(cache, repeats) -> cache with every batch row repeated (or None)
    FORWARD_COUNTER.take() -> (forward passes, rows) sampled since the last take()
    filter_logits(logits, temperature, top_k, top_p) -> logits with filtered entries at -inf
    sample_next_tokens(logits, temperature, top_k, top_p, generator) -> next token ids [B]
    padded_position_ids(attention_mask) -> position ids that skip left padding
    prompt_groups_within_budget(widths, num_samples, max_new_tokens, budget, by_length)
        -> prompt indices per sampling call within a rows x tokens budget
"""

from __future__ import annotations

import functools
import inspect
import logging
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from comlrl_core.models.tokens import plan_chunks

logger = logging.getLogger(__name__)


class ForwardCounter:
    """Forward passes and the rows they carried, summed over every :func:`sample_tokens`
    call of the process: ``rows / passes`` is the mean batch a decoding step ran at, the
    figure that decides decoding speed on CPU and GPU alike. Trainers log it per step."""

    def __init__(self) -> None:
        self.passes = 0
        self.rows = 0

    def add(self, rows: int) -> None:
        self.passes += 1
        self.rows += rows

    def take(self) -> tuple[int, int]:
        """(passes, rows) since the last call; resets both."""
        taken = (self.passes, self.rows)
        self.passes = self.rows = 0
        return taken


FORWARD_COUNTER = ForwardCounter()


@dataclass
class SampleOutput:
    """``tokens[b, :lengths[b]]`` are row b's generated tokens (EOS included when hit)."""

    tokens: torch.Tensor
    lengths: torch.Tensor
    stopped_on_eos: torch.Tensor


def padded_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions 0, 1, ... counted over real tokens only (pads get 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def filter_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Scale by temperature, then keep the top-k, then the smallest top-p nucleus.

    Filtered entries become ``-inf``; the most likely token is always kept.
    """
    if temperature <= 0:
        raise ValueError("filter_logits needs temperature > 0 (0 means greedy: use argmax)")
    logits = logits / temperature
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # mass strictly before each token: drop a token once the nucleus is already full
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
) -> torch.Tensor:
    """One token per row of ``logits [B, V]``: greedy at temperature 0, else a draw from
    the temperature -> top-k -> top-p distribution of :func:`filter_logits`.

    ``generator`` may be one generator for the whole batch, or a sequence of ``B`` CPU
    generators, one per row: each row then draws from its own generator (one uniform per
    step, inverted through the row's cumulative distribution), so a row's tokens do not
    depend on which other rows share the batch.

    With ``0 < top_k < V`` only the k candidates are sorted, filtered and drawn from (the
    same distribution as filtering the whole vocabulary, at a fraction of the cost: the
    full-vocabulary sort and draw dominated small-batch decoding).
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        values, candidates = torch.topk(logits, top_k, dim=-1)  # sorted, most likely first
        probs = filter_logits(values, temperature, 0, top_p).softmax(dim=-1)
        pick = _draw(probs, generator)
        return candidates.gather(-1, pick).squeeze(-1)
    probs = filter_logits(logits, temperature, top_k, top_p).softmax(dim=-1)
    return _draw(probs, generator).squeeze(-1)


def _draw(probs: torch.Tensor, generator: torch.Generator | Sequence[torch.Generator] | None) -> torch.Tensor:
    """One index per row of ``probs [B, K]`` (shape ``[B, 1]``)."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.multinomial(probs, 1, generator=generator)
    if len(generator) != probs.shape[0]:
        raise ValueError(f"got {len(generator)} row generators for {probs.shape[0]} rows")
    uniforms = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generator])
    cdf = probs.double().cumsum(dim=-1)
    # the first index whose cumulative mass exceeds u * total: never a zero-probability entry
    targets = (uniforms.to(cdf.device) * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, targets, right=True).clamp_(max=probs.shape[-1] - 1)


def _forward_params(model: torch.nn.Module) -> set[str]:
    """Keyword names the underlying transformers model's forward accepts."""
    get_base_model = getattr(model, "get_base_model", None)  # a PEFT wrapper's
    inner = get_base_model() if get_base_model is not None else model
    return set(inspect.signature(inner.forward).parameters)


def cache_kwarg_name(model: torch.nn.Module) -> str:
    # transformers 5.x renamed `past_key_values` to `cache`; accept both spellings.
    return "cache" if "cache" in _forward_params(model) else "past_key_values"


def supports_logits_to_keep(model: torch.nn.Module) -> bool:
    return "logits_to_keep" in _forward_params(model)


def _returned_cache(outputs):
    cache = getattr(outputs, "cache", None)
    return cache if cache is not None else getattr(outputs, "past_key_values", None)


def _repeatable_layer_types() -> tuple[type, ...]:
    """Cache layers whose whole state is the key/value tensors (batch on dim 0)."""
    from transformers import cache_utils

    names = ("DynamicLayer", "DynamicSlidingWindowLayer", "DynamicIndexedLayer")
    return tuple(getattr(cache_utils, n) for n in names if hasattr(cache_utils, n))


@functools.cache
def _preallocated_layer_type():
    """A ``DynamicLayer`` that writes new keys/values into a preallocated buffer.

    ``DynamicLayer`` grows by ``torch.cat``, copying the whole cache at every decoding step
    (quadratic in the sequence length; a fifth of small-batch decoding time on CPU). This
    layer reserves room for the tokens still to come once, after the prefill, then writes
    each step's keys/values in place and hands attention a view of the filled part.

    It subclasses a transformers internal, so :func:`preallocated_cache_unavailable` checks
    it once per process before any real cache is converted.
    """
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        def reserve(self, extra_tokens: int) -> None:
            keys, values = self.keys, self.values
            if keys is None or values is None:
                raise RuntimeError("reserve() needs a filled cache layer: call it after the prefill")
            filled = keys.shape[-2]
            shape = list(keys.shape)
            shape[-2] = filled + extra_tokens
            # Under autocast, attention would cast the whole cache to the compute dtype
            # at every step (rotary embeddings leave keys in fp32): store it cast once.
            device_type = keys.device.type
            dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
            self._key_buffer = keys.new_empty(shape, dtype=dtype or keys.dtype)
            self._value_buffer = values.new_empty(shape, dtype=dtype or values.dtype)
            self._key_buffer[..., :filled, :] = keys
            self._value_buffer[..., :filled, :] = values
            self._filled = filled
            self.keys = self._key_buffer[..., :filled, :]
            self.values = self._value_buffer[..., :filled, :]

        def update(self, key_states, value_states, *args, **kwargs):
            new = key_states.shape[-2]
            end = self._filled + new
            if end > self._key_buffer.shape[-2]:  # past the reservation: grow like DynamicLayer
                return super().update(key_states, value_states, *args, **kwargs)
            self._key_buffer[..., self._filled : end, :] = key_states
            self._value_buffer[..., self._filled : end, :] = value_states
            self._filled = end
            self.keys = self._key_buffer[..., :end, :]
            self.values = self._value_buffer[..., :end, :]
            return self.keys, self.values

    return DynamicLayer, PreallocatedLayer


def _holds_tokens(layer) -> bool:
    keys = getattr(layer, "keys", None)
    return getattr(layer, "is_initialized", True) and keys is not None and keys.numel() > 0


def _as_preallocated(layer, extra_tokens: int):
    """A preallocated copy of the filled dynamic ``layer`` with room for ``extra_tokens``."""
    _, preallocated = _preallocated_layer_type()
    grown = preallocated.__new__(preallocated)
    grown.__dict__.update(layer.__dict__)  # same state; only the update rule changes
    grown.reserve(extra_tokens)
    return grown


def _probe_preallocated_layer() -> str | None:
    """Feed a plain and a preallocated layer the same prefill and steps (one step past the
    reservation); None when they return and hold the same keys and values."""
    dynamic, _ = _preallocated_layer_type()
    gen = torch.Generator().manual_seed(0)
    prefill, *steps = (torch.randn(2, 2, n, 4, generator=gen) for n in (3, 1, 1, 1))
    plain, grown = dynamic(), dynamic()
    plain.update(prefill, -prefill)
    grown.update(prefill, -prefill)
    grown = _as_preallocated(grown, extra_tokens=2)
    for n, new in enumerate(steps):
        expected, got = plain.update(new, -new), grown.update(new, -new)
        if not all(torch.equal(a, b) for a, b in zip(expected, got, strict=True)):
            return f"step {n + 1} returned other keys/values than DynamicLayer"
        if n == 0 and grown.keys.data_ptr() != grown._key_buffer.data_ptr():
            return "a step did not write into the reserved buffer"
    if grown.get_seq_length() != plain.get_seq_length():
        return f"cache length {grown.get_seq_length()} differs from DynamicLayer's {plain.get_seq_length()}"
    return None


@functools.cache
def preallocated_cache_unavailable() -> str | None:
    """None when the preallocated KV cache works with this transformers, else why not
    (checked once, logged once)."""
    try:
        # fp32 buffers whatever region the first generate call runs in (under autocast
        # ``reserve`` stores the compute dtype, which would differ from the plain layer's)
        with torch.autocast("cpu", enabled=False):
            reason = _probe_preallocated_layer()
    except Exception as exc:  # noqa: BLE001 - transformers internals: any failure means plain caches
        reason = f"{type(exc).__name__}: {exc}"
    if reason is not None:
        logger.warning("the preallocated KV cache is off, decoding grows the cache by concatenation: %s", reason)
    return reason


def reserve_cache(cache, extra_tokens: int):
    """Give every plain dynamic layer of ``cache`` room for ``extra_tokens`` more tokens,
    written in place from then on (see :func:`_preallocated_layer_type`). Caches of other
    layouts, and every cache where the probe failed, are returned unchanged (they keep
    growing their own way)."""
    layers = getattr(cache, "layers", None)
    if extra_tokens < 1 or not layers or not isinstance(layers, list):
        return cache
    if preallocated_cache_unavailable() is not None:
        return cache
    dynamic, _ = _preallocated_layer_type()
    if not all(type(layer) is dynamic and _holds_tokens(layer) for layer in layers):
        return cache
    layers[:] = [_as_preallocated(layer, extra_tokens) for layer in layers]
    return cache


def repeat_cache_rows(cache, repeats: int):
    """Repeat every batch row of a KV cache ``repeats`` times (row b -> rows b*r .. b*r+r-1).

    Returns the repeated cache, or ``None`` when the cache holds state this helper does not
    know how to repeat safely (linear-attention, quantized or static layers); the caller then
    falls back to prefilling the repeated prompts.
    """
    if repeats == 1:
        return cache
    if isinstance(cache, tuple):  # legacy format: ((key, value), ...) per layer
        return tuple(tuple(t.repeat_interleave(repeats, dim=0) for t in layer) for layer in cache)
    layers = getattr(cache, "layers", None)
    allowed = _repeatable_layer_types()
    # exact types: subclasses (quantized, linear-attention hybrids) keep extra per-row state
    if not layers or not all(type(layer) in allowed for layer in layers):
        return None
    cache.batch_repeat_interleave(repeats)
    return cache


@torch.no_grad()
def sample_tokens(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    eos_token_ids: Iterable[int],
    pad_token_id: int,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    num_samples: int = 1,
    row_adapters: Sequence[str] | None = None,
) -> SampleOutput:
    """Sample up to ``max_new_tokens`` for every row of a left-padded batch at once.

    Each decoding step is ONE forward pass over the whole batch; rows that hit EOS keep
    running (their tokens become ``pad_token_id``) until all rows stop or the budget ends.

    ``num_samples > 1`` draws that many samples per input row: the prompts are prefilled
    once, then the KV cache, last logits, mask and positions are repeated row by row, so
    output row ``b * num_samples + s`` is sample ``s`` of input row ``b`` -- the same rows,
    in the same order, as passing every prompt ``num_samples`` times (same seed, same tokens).
    ``generator`` may be a sequence of one CPU generator per OUTPUT row (see
    :func:`sample_next_tokens`).

    ``row_adapters`` (one name per INPUT row) runs each row through its own LoRA adapter of
    a peft model in the same forward passes (peft's mixed-adapter batches): agents that
    share a base sample together, reading the base weights once per step.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    batch = input_ids.shape[0] * num_samples
    device = input_ids.device
    eos = torch.tensor(sorted(set(eos_token_ids)), device=device, dtype=torch.long)
    cache_name = cache_kwarg_name(model)
    keep_last = {"logits_to_keep": 1} if supports_logits_to_keep(model) else {}
    if row_adapters is not None and len(row_adapters) != input_ids.shape[0]:
        raise ValueError(f"got {len(row_adapters)} row adapters for {input_ids.shape[0]} input rows")
    adapters: dict[str, list[str]] = {} if row_adapters is None else {"adapter_names": list(row_adapters)}

    mask = attention_mask.to(device=device, dtype=torch.long)
    positions = padded_position_ids(mask)
    step_ids = input_ids
    step_positions = positions
    cache = None
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    chosen: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        outputs = model(
            input_ids=step_ids,
            attention_mask=mask,
            position_ids=step_positions,
            use_cache=True,
            **{cache_name: cache},
            **keep_last,
            **adapters,
        )
        FORWARD_COUNTER.add(step_ids.shape[0])
        cache = _returned_cache(outputs)
        logits = outputs.logits[:, -1, :].float()
        if step == 0 and num_samples > 1:
            # the prompt prefill (the long pass) ran once per prompt; fan out to samples
            mask = mask.repeat_interleave(num_samples, dim=0)
            step_positions = step_positions.repeat_interleave(num_samples, dim=0)
            if adapters:
                adapters = {"adapter_names": [a for a in adapters["adapter_names"] for _ in range(num_samples)]}
            cache = repeat_cache_rows(cache, num_samples)
            if cache is None:  # unknown cache layout: prefill the repeated prompts instead
                outputs = model(
                    input_ids=step_ids.repeat_interleave(num_samples, dim=0),
                    attention_mask=mask,
                    position_ids=step_positions,
                    use_cache=True,
                    **keep_last,
                    **adapters,
                )
                FORWARD_COUNTER.add(batch)
                cache = _returned_cache(outputs)
                logits = outputs.logits[:, -1, :].float()
            else:
                logits = logits.repeat_interleave(num_samples, dim=0)
        if step == 0:
            cache = reserve_cache(cache, max_new_tokens - 1)
        next_ids = sample_next_tokens(logits, temperature, top_k, top_p, generator)
        next_ids = torch.where(finished, torch.full_like(next_ids, pad_token_id), next_ids)
        chosen.append(next_ids)
        lengths += (~finished).long()
        finished |= torch.isin(next_ids, eos)
        if bool(finished.all()):
            break
        step_ids = next_ids[:, None]
        step_positions = step_positions[:, -1:] + 1
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype, device=device)], dim=1)
    tokens = torch.stack(chosen, dim=1) if chosen else torch.empty(batch, 0, dtype=torch.long)
    # stopped_on_eos: the last real token is an EOS (a row can't be finished otherwise)
    return SampleOutput(tokens=tokens, lengths=lengths, stopped_on_eos=finished.clone())


def prompt_groups_within_budget(
    widths: Sequence[int], num_samples: int, max_new_tokens: int, budget: int | None, by_length: bool
) -> list[list[int]]:
    """Prompt indices per sampling call: ``rows * (widest prompt + max_new_tokens)`` stays
    within ``budget`` (a lone prompt's rows may exceed it). ``by_length``: group prompts
    of similar length (shortest first) instead of keeping their order."""
    order = sorted(range(len(widths)), key=widths.__getitem__) if by_length else list(range(len(widths)))
    # a prompt is one unit of num_samples rows, each row as wide as the prompt plus its new tokens
    costs = [num_samples * (widths[p] + max_new_tokens) for p in order]
    return [[order[u] for u in span] for span in plan_chunks(costs, 1, max(1, len(order)), budget)]
