"""The KV cache layouts the sampler writes into, and how to reshape them.

transformers' ``DynamicLayer`` grows by ``torch.cat`` at every decoding step. The sampler
instead reserves room for the whole completion once (:func:`reserve_cache`, or
:meth:`PreallocatedLayer.allocate` for a chunked prefill) and writes each step in place;
it repeats rows for several samples of one prompt (:func:`repeat_cache_rows`) and drops
finished rows (``select_rows``, :mod:`comlrl_core.models.active_rows`). Anything not made of
plain dynamic layers is left alone: the callers fall back to transformers' own growth.

Public API::

    preallocated_cache_unavailable() -> None, or why the in-place cache is off (probed once)
    reserve_cache(cache, extra_tokens) -> the cache, each plain layer with room reserved
    repeat_cache_rows(cache, repeats) -> the cache with every row repeated (or None)
    repeatable_layer_types() -> the layer classes whose whole state is keys and values
"""

from __future__ import annotations

import functools
import logging

import torch

logger = logging.getLogger("comlrl_core.models.sampling")  # the sampler's log, as before


def repeatable_layer_types() -> tuple[type, ...]:
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
            self.allocate(keys.shape[0], filled, extra_tokens)
            self._key_buffer[..., :filled, :] = keys
            self._value_buffer[..., :filled, :] = values

        def allocate(self, rows: int, filled: int, extra_tokens: int) -> None:
            """Empty buffers for ``rows`` rows of ``filled + extra_tokens`` tokens, shaped and
            typed like the layer's current keys/values; the first ``filled`` count as held
            (the caller writes them)."""
            keys, values = self.keys, self.values
            if keys is None or values is None:
                raise RuntimeError("allocate() needs a filled cache layer to copy its layout from")
            shape = [rows, *keys.shape[1:]]
            shape[-2] = filled + extra_tokens
            # Under autocast, attention would cast the whole cache to the compute dtype
            # at every step (rotary embeddings leave keys in fp32): store it cast once.
            device_type = keys.device.type
            dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
            self._key_buffer = _empty_keys(keys, shape, dtype or keys.dtype)
            self._value_buffer = values.new_empty(shape, dtype=dtype or values.dtype)
            self._filled = filled
            self.keys = self._key_buffer[..., :filled, :]
            self.values = self._value_buffer[..., :filled, :]

        def write_prefill(self, start: int, stop: int, keys, values, fan_out: int) -> None:
            """Store a row chunk's prefill: input rows ``start:stop`` (of a batch that fans
            out to ``fan_out`` rows per input row) right-aligned in the held tokens, the
            columns left of a narrower chunk zeroed (masked out; zeros keep them finite)."""
            width = keys.shape[-2]
            for buffer, new in ((self._key_buffer, keys), (self._value_buffer, values)):
                rows = buffer.view(-1, fan_out, *buffer.shape[1:])[start:stop]  # [inputs, fan_out, H, T, D]
                rows[..., self._filled - width : self._filled, :] = new[:, None]  # broadcast: no repeated copy
                rows[..., : self._filled - width, :] = 0

        def select_rows(self, index: torch.Tensor) -> None:
            """Keep only the batch rows ``index`` (finished rows leave the batch)."""
            keys, values = self.keys, self.values
            if keys is None or values is None:
                raise RuntimeError("select_rows() needs a filled cache layer")
            if keys.data_ptr() != self._key_buffer.data_ptr():  # grown past the reservation
                self.keys, self.values = keys.index_select(0, index), values.index_select(0, index)
                return
            # index_select on the stored [B, H, D, T] layout keeps it
            self._key_buffer = self._key_buffer.transpose(-1, -2).index_select(0, index).transpose(-1, -2)
            self._value_buffer = self._value_buffer.index_select(0, index)
            self.keys = self._key_buffer[..., : self._filled, :]
            self.values = self._value_buffer[..., : self._filled, :]

        def room(self) -> int:
            """Tokens the reservation still holds (0 once grown past it by concatenation)."""
            keys = self.keys
            if keys is None or keys.data_ptr() != self._key_buffer.data_ptr():
                return 0
            return self._key_buffer.shape[-2] - self._filled

        def drop_newest(self) -> None:
            """Forget the newest token (a step that is about to be recomputed)."""
            self._filled -= 1
            self.keys = self._key_buffer[..., : self._filled, :]
            self.values = self._value_buffer[..., : self._filled, :]

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


def _empty_keys(like: torch.Tensor, shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    """An empty key buffer ``shape`` = ``[B, H, T, D]``, a view of ``[B, H, D, T]`` storage.

    Why: a decoding step's attention scores are ``q @ K^T`` over the whole cache; with
    the tokens contiguous along the last axis that product reads the keys as the GEMM
    library's plain operand (SmolLM2, 16 rows x 400 tokens, 30 layers on 2 cores: 13.8 ->
    8.2 ms a step for the scores). Every reader sees an ordinary ``[B, H, T, D]`` tensor.
    """
    return like.new_empty([*shape[:-2], shape[-1], shape[-2]], dtype=dtype).transpose(-1, -2)


def _holds_tokens(layer) -> bool:
    keys = getattr(layer, "keys", None)
    return getattr(layer, "is_initialized", True) and keys is not None and keys.numel() > 0


def _as_preallocated(layer, extra_tokens: int):
    """A preallocated copy of the filled dynamic ``layer`` with room for ``extra_tokens``."""
    grown = _as_preallocated_shell(layer)  # same state; only the update rule changes
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
    allowed = repeatable_layer_types()
    # exact types: subclasses (quantized, linear-attention hybrids) keep extra per-row state
    if not layers or not all(type(layer) in allowed for layer in layers):
        return None
    cache.batch_repeat_interleave(repeats)
    return cache


def _as_preallocated_shell(layer):
    """A preallocated layer with ``layer``'s state, buffers not yet allocated."""
    _, preallocated = _preallocated_layer_type()
    shell = preallocated.__new__(preallocated)
    shell.__dict__.update(layer.__dict__)
    return shell
