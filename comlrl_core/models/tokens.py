"""Token-level helpers shared by learners: padding, masks, masked reductions, chunking.

Conventions (the same as :mod:`comlrl_core.policy`): a completion's tokens are exactly
the generated ids, EOS included when the model stopped on it, pads never. A mask is 1 on
real tokens and 0 on padding, so ``masked_sum(logprobs, mask)`` counts every real token
(EOS included) and no pad.
"""

from __future__ import annotations

from typing import Iterator, Sequence, TypeVar

import torch

T = TypeVar("T")


def pad_sequences(
    sequences: Sequence[Sequence[int]],
    pad_value: int = 0,
    side: str = "right",
    dtype: torch.dtype = torch.long,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack ragged id lists into ``(ids, mask)``, both ``[batch, max_len]``.

    ``side="left"`` puts the padding first (what causal-LM generation wants for prompts).
    """
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    max_len = max((len(s) for s in sequences), default=0)
    ids = torch.full((len(sequences), max_len), pad_value, dtype=dtype)
    mask = torch.zeros((len(sequences), max_len), dtype=torch.long)
    for row, seq in enumerate(sequences):
        n = len(seq)
        if n == 0:
            continue
        start = 0 if side == "right" else max_len - n
        ids[row, start : start + n] = torch.as_tensor(list(seq), dtype=dtype)
        mask[row, start : start + n] = 1
    return ids, mask


def lengths_to_mask(lengths: Sequence[int] | torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """``[batch, max_len]`` right-padded mask with ``lengths[i]`` leading ones."""
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    width = int(lengths.max().item()) if max_len is None and lengths.numel() else (max_len or 0)
    return (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).long()


def truncate_after_eos(token_ids: Sequence[int], eos_ids: int | Sequence[int] | None) -> list[int]:
    """Keep tokens up to and including the first EOS (drop whatever a batch padded after it)."""
    ids = list(token_ids)
    if eos_ids is None:
        return ids
    eos = {eos_ids} if isinstance(eos_ids, int) else set(eos_ids)
    for i, tok in enumerate(ids):
        if tok in eos:
            return ids[: i + 1]
    return ids


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum of ``values`` over real positions only (pads contribute exactly 0, even if NaN)."""
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Mean over real positions; an all-pad row gives 0 rather than NaN."""
    count = mask.to(values.dtype).sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence KL(pi || ref) with Schulman's k3 estimator, summed over real tokens.

    k3 = exp(ref - logp) - (ref - logp) - 1 is non-negative and unbiased for samples drawn
    from ``pi``.
    """
    log_ratio = ref_logprobs - logprobs
    per_token = torch.exp(log_ratio) - log_ratio - 1.0
    return masked_sum(per_token, mask)


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """Consecutive slices of at most ``size`` items (``size >= 1``)."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    for start in range(0, len(items), size):
        yield items[start : start + size]
