"""Token-level helpers shared by learners: masked sums, the k3 KL estimator, chunking
(by count, and by a padded-token budget: :func:`plan_chunks`).

Conventions (the same as :mod:`comlrl_core.policy`): a completion's tokens are exactly
the generated ids, EOS included when the model stopped on it, pads never. A mask is 1 on
real tokens and 0 on padding, so ``masked_sum(logprobs, mask)`` counts every real token
(EOS included) and no pad.
"""

from __future__ import annotations

from typing import Iterator, Sequence, TypeVar

import torch

T = TypeVar("T")


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum of ``values`` over real positions only (pads contribute exactly 0, even if NaN)."""
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum(dim=dim)


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


def plan_chunks(widths: Sequence[int], unit_rows: int, max_rows: int, token_budget: int | None) -> list[range]:
    """Consecutive row ranges for micro-batches.

    Rows come in units of ``unit_rows`` (a group scored together; 1 for single rows) and
    ``widths[u]`` is unit u's padded token count when scored (prompt plus completions).
    A chunk holds whole units, at most ``max_rows`` rows (but at least one unit) and, with
    a ``token_budget``, at most that many padded tokens: ``units * widest unit`` (at least
    one unit, however wide).
    """
    chunks: list[range] = []
    start = 0  # first unit of the open chunk
    widest = 0
    units = len(widths)
    for u in range(units):
        count = u - start
        wider = max(widest, widths[u])
        too_many_rows = (count + 1) * unit_rows > max_rows
        too_many_tokens = token_budget is not None and (count + 1) * wider > token_budget
        if count and (too_many_rows or too_many_tokens):
            chunks.append(range(start * unit_rows, u * unit_rows))
            start, wider = u, widths[u]
        widest = wider
    if units:
        chunks.append(range(start * unit_rows, units * unit_rows))
    return chunks
