"""The prompt pass of a sampling call: row chunks written into one preallocated cache,
with the prompts' common beginning encoded once.

Two things make the prompt pass cheaper than one forward over the left-padded batch:

- **Row chunks** (``prefill_token_budget``): the rows are prefilled in chunks of at most
  that many padded tokens, each cut to its own longest prompt, and every chunk's
  keys/values go straight into one cache allocated at its final size (rows x samples,
  room for the new tokens). Activations peak at one chunk's; no full-width prefill cache,
  no fanned-out copy, no copy into the reservation.
- **A shared beginning, once**: prompts of one call often start the same (the task text
  before each tree node's own history and feedback; the chat template's system turn).
  When a run of rows that use the same adapter shares at least ``MIN_SHARED_PREFIX``
  tokens, that beginning is encoded once, and each chunk encodes only the rest of its
  prompts on top of it. Turn 2 of MAGRPO's tree (4 prompts of ~410 tokens that share
  ~300) then costs about half the prompt tokens.

The cache layout per row: ``[zeros | shared beginning | left padding | rest of prompt]``,
right-aligned to the call's width. The returned attention mask marks exactly the held
tokens (a hole where a short rest was padded): attention masks by that mask and positions
are explicit, so the model sees the same prompt as from one left-padded pass. The values
equal that pass's up to float summation order (the shared tokens' attention and GEMMs run
at another batch shape), as with any change of batch size.

Public API::

    prefill_chunks(prompt_lengths, budget) -> input-row ranges of one chunk each
    chunked_prefill(model, input_ids, mask, positions, *, budget, num_samples, extra_tokens,
                    row_adapters, forward_kwargs, cache_name, share_prefix=True)
        -> (cache, last logits [rows * num_samples, V], cache mask [rows, W]) | None
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from comlrl_core.models.kv_cache import (
    _as_preallocated_shell,
    _holds_tokens,
    _preallocated_layer_type,
    preallocated_cache_unavailable,
)
from comlrl_core.models.tokens import plan_chunks

# Below this many common tokens, the extra pass costs more than the tokens it saves.
MIN_SHARED_PREFIX = 16


def prefill_chunks(prompt_lengths: Sequence[int], budget: int | None) -> list[range]:
    """Consecutive input-row ranges whose prefill holds at most ``budget`` padded tokens
    (``rows * longest prompt of the chunk``; a lone prompt may exceed it)."""
    return plan_chunks(prompt_lengths, 1, max(1, len(prompt_lengths)), budget)


def returned_cache(outputs: Any) -> Any:
    cache = getattr(outputs, "cache", None)
    return cache if cache is not None else getattr(outputs, "past_key_values", None)


def shared_prefix_runs(
    prompts: Sequence[Sequence[int]], row_adapters: Sequence[str] | None, minimum: int = MIN_SHARED_PREFIX
) -> list[tuple[range, int]]:
    """Consecutive runs of rows with one adapter, each with the length of its rows' common
    beginning (0 below ``minimum``, or for a run of one row). Every row keeps at least one
    token of its own: its last prompt token's logits start the sampling."""
    runs: list[tuple[range, int]] = []
    start = 0
    for stop in range(1, len(prompts) + 1):
        if stop < len(prompts) and (row_adapters is None or row_adapters[stop] == row_adapters[start]):
            continue
        rows = prompts[start:stop]
        common = 0
        if len(rows) > 1:
            limit = min(len(r) for r in rows) - 1
            first = rows[0]
            while common < limit and all(r[common] == first[common] for r in rows[1:]):
                common += 1
        runs.append((range(start, stop), common if common >= minimum else 0))
        start = stop
    return runs


def _prefix_layers(model: torch.nn.Module, ids: list[int], adapter: str | None, forward_kwargs: dict, device):
    """Keys/values of one shared beginning ([1, H, T, D] per layer), or None when the
    model's cache is not made of plain dynamic layers (the rows are then prefilled whole)."""
    dynamic, _ = _preallocated_layer_type()
    outputs = model(
        input_ids=torch.tensor([ids], dtype=torch.long, device=device),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
        position_ids=torch.arange(len(ids), device=device)[None],
        use_cache=True,
        **forward_kwargs,
        **({"adapter_names": [adapter]} if adapter is not None else {}),
    )
    layers = getattr(returned_cache(outputs), "layers", None)
    if not layers or not all(type(layer) is dynamic and _holds_tokens(layer) for layer in layers):
        return None
    return [(layer.keys, layer.values) for layer in layers]


def _cache_from_prefix(prefix: list[tuple[torch.Tensor, torch.Tensor]], rows: int):
    """A dynamic cache holding the shared beginning for ``rows`` rows."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for index, (keys, values) in enumerate(prefix):
        cache.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), index)
    return cache


def chunked_prefill(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    *,
    budget: int,
    num_samples: int,
    extra_tokens: int,
    row_adapters: Sequence[str] | None,
    forward_kwargs: dict,
    cache_name: str,
    count: Callable[[int], None] = lambda rows: None,
    share_prefix: bool = True,
):
    """Prefill ``input_ids`` (left-padded) in row chunks of at most ``budget`` padded
    tokens, each chunk's common beginning with its run encoded once (``share_prefix``),
    into one preallocated cache of ``rows * num_samples`` rows with room for
    ``extra_tokens``. Returns ``(cache, last logits [rows * num_samples, V], cache mask
    [rows, W])``, or None when the model's cache is not made of plain dynamic layers (the
    caller prefills unchunked). ``forward_kwargs`` go to every pass (e.g. logits_to_keep);
    ``count(rows)`` hears of every forward pass (the sampler's rows-per-pass figure).
    """
    if preallocated_cache_unavailable() is not None:
        return None
    dynamic, _ = _preallocated_layer_type()
    device = input_ids.device
    lengths = mask.sum(dim=-1).tolist()
    width = input_ids.shape[1]
    prompts = [row[width - n :] for row, n in zip(input_ids.tolist(), lengths, strict=True)]
    runs = shared_prefix_runs(prompts, row_adapters) if share_prefix else [(range(len(prompts)), 0)]
    cache_mask = torch.zeros_like(mask)
    cache = None
    logits: list[torch.Tensor] = []
    for run, common in runs:
        prefix = None
        if common:
            adapter = row_adapters[run.start] if row_adapters is not None else None
            prefix = _prefix_layers(model, prompts[run.start][:common], adapter, forward_kwargs, device)
            count(1)
            common = common if prefix is not None else 0
        for part in prefill_chunks([lengths[i] - common for i in run], budget):
            rows = slice(run.start + part.start, run.start + part.stop)
            own = torch.tensor([n - common for n in lengths[rows]], device=device)  # tokens past the shared part
            rest = max(1, int(own.max()))
            cols = slice(width - rest, width)
            adapters = {"adapter_names": list(row_adapters[rows])} if row_adapters is not None else {}
            # left padding of each row's own part (a shorter row's shared tokens are not fed twice)
            chunk_mask = (torch.arange(rest, device=device) >= rest - own[:, None]).to(mask.dtype)
            step_kwargs = dict(forward_kwargs)
            if prefix is not None:
                shared = torch.ones(chunk_mask.shape[0], common, dtype=mask.dtype, device=device)
                chunk_mask = torch.cat([shared, chunk_mask], dim=1)
                step_kwargs[cache_name] = _cache_from_prefix(prefix, chunk_mask.shape[0])
            outputs = model(
                input_ids=input_ids[rows, cols],
                attention_mask=chunk_mask,
                position_ids=positions[rows, cols],  # already counted from each row's first token
                use_cache=True,
                **step_kwargs,
                **adapters,
            )
            count(rows.stop - rows.start)
            chunk_cache = returned_cache(outputs)
            logits.append(outputs.logits[:, -1, :].float())
            del outputs
            layers = getattr(chunk_cache, "layers", None)
            if not layers or not isinstance(layers, list):
                return None
            if cache is None:  # first chunk: the layout check and the final-size cache
                if not all(type(layer) is dynamic and _holds_tokens(layer) for layer in layers):
                    return None
                chunk_layers = list(layers)
                layers[:] = [_as_preallocated_shell(layer) for layer in chunk_layers]
                for layer in layers:
                    layer.allocate(input_ids.shape[0] * num_samples, width, extra_tokens)
                cache = chunk_cache
            else:
                chunk_layers = layers
            for layer, new in zip(cache.layers, chunk_layers, strict=True):
                layer.write_prefill(rows.start, rows.stop, new.keys, new.values, num_samples)
            cache_mask[rows, width - chunk_mask.shape[1] :] = chunk_mask
            del chunk_cache, chunk_layers, layers
    return cache, torch.cat(logits).repeat_interleave(num_samples, dim=0), cache_mask
