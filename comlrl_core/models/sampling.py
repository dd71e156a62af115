"""Batched autoregressive sampling driven by a private ``torch.Generator``.

Why not ``model.generate``: in transformers 5 it samples with the global RNG
(``torch.multinomial`` without a generator), so a seed could only be honoured by
re-seeding global state. This loop is the same algorithm (KV cache, left padding,
temperature -> top-k -> top-p, multinomial) with the generator passed explicitly, so
a given seed gives the same samples whatever the global RNG state.

Public API::

    sample_tokens(model, input_ids, attention_mask, *, max_new_tokens, temperature=1.0,
                  top_p=1.0, top_k=0, eos_token_ids, pad_token_id, generator=None,
                  num_samples=1, row_adapters=None, prefill_token_budget=None,
                  stop_watch=None, lean_step=True, share_prefix=True)
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

import contextlib
import functools
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch

from comlrl_core.models.active_rows import ActiveRows
from comlrl_core.models.kv_cache import repeat_cache_rows, reserve_cache
from comlrl_core.models.last_position_mlp import last_position_mlp
from comlrl_core.models.lean_decode import lean_decoder, probe_step, unsupported_reason
from comlrl_core.models.lora import transformers_model
from comlrl_core.models.prefill import chunked_prefill, returned_cache
from comlrl_core.models.stop_watch import StopWatch
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
    """One index per row of ``probs [B, K]`` (shape ``[B, 1]``): one uniform per row,
    inverted through the row's cumulative distribution. (``torch.multinomial`` draws one
    exponential per vocabulary entry instead: 14 ms a step for 16 rows of a 49k vocabulary
    on a 2-core CPU, a seventh of a decoding step.)"""
    if generator is None or isinstance(generator, torch.Generator):
        uniforms = torch.rand(probs.shape[0], generator=generator, dtype=torch.float64, device=probs.device)
    elif len(generator) != probs.shape[0]:
        raise ValueError(f"got {len(generator)} row generators for {probs.shape[0]} rows")
    else:
        uniforms = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generator])
    cdf = probs.double().cumsum(dim=-1)
    # the first index whose cumulative mass exceeds u * total: never a zero-probability entry
    targets = (uniforms.to(cdf.device) * cdf[:, -1]).unsqueeze(-1)
    return torch.searchsorted(cdf, targets, right=True).clamp_(max=probs.shape[-1] - 1)


def _forward_params(model: torch.nn.Module) -> set[str]:
    """Keyword names the underlying transformers model's forward accepts."""
    return set(inspect.signature(transformers_model(model).forward).parameters)


def cache_kwarg_name(model: torch.nn.Module) -> str:
    # transformers 5.x renamed `past_key_values` to `cache`; accept both spellings.
    return "cache" if "cache" in _forward_params(model) else "past_key_values"


def supports_logits_to_keep(model: torch.nn.Module) -> bool:
    return "logits_to_keep" in _forward_params(model)


def _forward_step(model: torch.nn.Module, inputs: dict, cache_name: str, cache):
    """One pass of the model's own forward: (the cache it returns, last logits in fp32)."""
    outputs = model(**inputs, **{cache_name: cache})
    # the prefill's hidden states and logits are not kept through decoding
    return returned_cache(outputs), outputs.logits[:, -1, :].float()


def _forward_logits(model: torch.nn.Module, inputs: dict, cache_name: str, cache) -> torch.Tensor:
    return _forward_step(model, inputs, cache_name, cache)[1]


def _fan_out(
    mask: torch.Tensor, positions: torch.Tensor, adapters: dict[str, list[str]], num_samples: int
) -> tuple[torch.Tensor, torch.Tensor, dict[str, list[str]]]:
    """Each input row's mask, positions and adapter name repeated for its ``num_samples``
    samples (output rows prompt-major, as the fanned-out cache)."""
    if adapters:
        adapters = {"adapter_names": [a for a in adapters["adapter_names"] for _ in range(num_samples)]}
    return mask.repeat_interleave(num_samples, dim=0), positions.repeat_interleave(num_samples, dim=0), adapters


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
    prefill_token_budget: int | None = None,
    stop_watch: StopWatch | None = None,
    lean_step: bool = True,
    share_prefix: bool = True,
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

    ``prefill_token_budget`` prefills the prompts in row chunks of at most that many padded
    tokens, written into the decoding cache as they come, and (``share_prefix``) the
    common beginning of a run of prompts encoded once (see :mod:`comlrl_core.models.prefill`):
    the same prompt at a lower memory peak and fewer prompt tokens. None: one prefill
    pass for the whole batch.

    Finished rows leave the batch: with one generator per row, the rows that have hit EOS
    (or a stop string of ``stop_watch``, see :mod:`comlrl_core.models.stop_watch`) are
    dropped from the KV cache and the next forward passes once a quarter of the running
    rows are done (:mod:`comlrl_core.models.active_rows`); the sampled tokens are the same.
    With one shared generator every row keeps drawing, so the stream stays the same.

    The prompt passes run the last decoder layer's MLP on each row's last position only
    (:mod:`comlrl_core.models.last_position_mlp`): this function reads nothing of them
    but the cache and the last logits.

    ``lean_step`` runs the decoding steps of a supported model (Llama-family, plain or
    vanilla LoRA, preallocated cache) through :mod:`comlrl_core.models.lean_decode`: the
    same arithmetic without transformers' per-module overhead, checked against the model's
    forward on its first step. False: every step through the model's forward.
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
    hit_eos = torch.zeros(batch, dtype=torch.bool, device=device)  # finished by EOS (not a stop string)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    chosen: list[torch.Tensor] = []
    running = ActiveRows(batch, device)
    can_drop = ActiveRows.can_drop(generator)
    prefilled = None
    decoder = lean_decoder(model) if lean_step else None  # once per call: it walks the modules for hooks
    if prefill_token_budget is not None:
        with last_position_mlp(model):  # the prompt passes: only the cache and the last logits are read
            prefilled = chunked_prefill(
                model,
                input_ids,
                mask,
                positions,
                budget=prefill_token_budget,
                num_samples=num_samples,
                extra_tokens=max_new_tokens - 1,
                row_adapters=row_adapters,
                forward_kwargs={cache_name: None, **keep_last},
                cache_name=cache_name,
                count=FORWARD_COUNTER.add,
                share_prefix=share_prefix,
            )
    call_decoder = decoder  # the probe may drop ``decoder``; its call still ends below
    if call_decoder is not None:
        call_decoder.start_call()  # per-call state (stacked adapters) lives until the call ends
    try:
        for step in range(max_new_tokens):
            if step == 0 and prefilled is not None:  # prefilled chunk by chunk: cache fanned out and reserved
                cache, logits, mask = prefilled  # mask: the tokens the cache holds (see prefill)
                if num_samples > 1:
                    mask, step_positions, adapters = _fan_out(mask, step_positions, adapters, num_samples)
            else:
                step_inputs: dict[str, Any] = {
                    "input_ids": step_ids,
                    "attention_mask": mask,
                    "position_ids": step_positions,
                }
                step_inputs.update(use_cache=True, **keep_last, **adapters)
                logits = None
                if decoder is not None and step > 0:
                    names = adapters.get("adapter_names")
                    if decoder.checked:
                        logits = decoder.step(step_ids, mask, step_positions, cache, names)
                    else:  # first lean step of this model: compared with the model's own
                        reference = functools.partial(_forward_logits, model, step_inputs, cache_name)
                        logits = probe_step(decoder, model, reference, step_ids, mask, step_positions, cache, names)
                        if unsupported_reason(model) is not None:  # the probe switched it off
                            decoder = None
                if logits is None:
                    with last_position_mlp(model) if step == 0 else contextlib.nullcontext():  # step 0: the prompt
                        cache, logits = _forward_step(model, step_inputs, cache_name, cache)
                FORWARD_COUNTER.add(step_ids.shape[0])
            if step == 0 and num_samples > 1 and prefilled is None:
                # the prompt prefill (the long pass) ran once per prompt; fan out to samples
                mask, step_positions, adapters = _fan_out(mask, step_positions, adapters, num_samples)
                cache = repeat_cache_rows(cache, num_samples)
                if cache is None:  # unknown cache layout: prefill the repeated prompts instead
                    with last_position_mlp(model):
                        outputs = model(
                            input_ids=step_ids.repeat_interleave(num_samples, dim=0),
                            attention_mask=mask,
                            position_ids=step_positions,
                            use_cache=True,
                            **keep_last,
                            **adapters,
                        )
                    FORWARD_COUNTER.add(batch)
                    cache = returned_cache(outputs)
                    logits = outputs.logits[:, -1, :].float()
                else:
                    logits = logits.repeat_interleave(num_samples, dim=0)
            if step == 0 and prefilled is None:
                cache = reserve_cache(cache, max_new_tokens - 1)
            prefilled = None
            drawn = sample_next_tokens(logits, temperature, top_k, top_p, generator)  # running rows only
            next_ids = torch.full((batch,), pad_token_id, dtype=drawn.dtype, device=device)
            next_ids[running.index] = drawn
            next_ids = torch.where(finished, torch.full_like(next_ids, pad_token_id), next_ids)
            chosen.append(next_ids)
            lengths += (~finished).long()
            hit_eos |= torch.isin(next_ids, eos) & ~finished
            finished |= hit_eos
            if stop_watch is not None and stop_watch.due(step):
                finished |= stop_watch.watch(chosen, ~finished)
            if bool(finished.all()):
                break
            step_positions = step_positions[:, -1:] + 1
            mask = torch.cat([mask, torch.ones(mask.shape[0], 1, dtype=mask.dtype, device=device)], dim=1)
            if can_drop and running.worth_dropping(finished):
                names = adapters.get("adapter_names")
                shrunk = running.drop_finished(finished, cache, mask, step_positions, generator, names)  # type: ignore[arg-type]
                if shrunk is None:
                    can_drop = False  # a cache layout that cannot shrink: keep every row
                else:
                    mask, step_positions, generator, names = shrunk
                    if names is not None:
                        adapters = {"adapter_names": names}
            step_ids = next_ids[running.index][:, None]
    finally:
        if call_decoder is not None:
            call_decoder.end_call()
    tokens = torch.stack(chosen, dim=1) if chosen else torch.empty(batch, 0, dtype=torch.long)
    return SampleOutput(tokens=tokens, lengths=lengths, stopped_on_eos=hit_eos)


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
