"""Batched, memory-bounded log-prob passes over a policy's completions.

Learners score many completions per update. These helpers run ``Policy.token_logprobs``
on micro-batches of ``micro_batch_size`` sequences, so peak activation memory is bounded
by one micro-batch while the work stays batched.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from comlrl_core.policy import Policy
from learners.common.shared_prefix import shared_prefix_token_logprobs, supports_shared_prefix


def _index_chunks(n: int, size: int) -> list[range]:
    return [range(s, min(s + size, n)) for s in range(0, n, size)]


def _groups_share_prompts(policy: Policy, prompt_ids: Sequence[Sequence[int]], group_size: int) -> bool:
    if group_size < 2 or len(prompt_ids) % group_size or not supports_shared_prefix(policy):
        return False
    return all(
        list(prompt_ids[s + j]) == list(prompt_ids[s])
        for s in range(0, len(prompt_ids), group_size)
        for j in range(1, group_size)
    )


@torch.no_grad()
def sequence_logprobs_nograd(
    policy: Policy,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    micro_batch_size: int,
) -> list[torch.Tensor]:
    """Per-token log-probs (real tokens only, 1-D per completion), without gradients."""
    out: list[torch.Tensor] = []
    for idx in _index_chunks(len(prompt_ids), micro_batch_size):
        logp, mask = policy.token_logprobs([prompt_ids[i] for i in idx], [completion_ids[i] for i in idx])
        logp, mask = logp.float().cpu(), mask.bool().cpu()
        for row in range(len(idx)):
            out.append(logp[row][mask[row]])
    return out


def accumulate_gradients(
    policy: Policy,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor, range], torch.Tensor],
    micro_batch_size: int,
    on_loss: Callable[[torch.Tensor], bool] | None = None,
    group_size: int | None = None,
) -> float:
    """Run ``loss_fn(token_logprobs, mask, indices)`` per micro-batch and backpropagate.

    ``loss_fn`` must return the micro-batch's share of the total loss (shares add up).
    ``on_loss`` sees each share before its backward and may veto it (return False), which
    stops the pass (e.g. on a NaN). Returns the summed loss value (NaN if vetoed).
    ``group_size``: consecutive rows come in groups of this size; when each group shares
    one prompt and the policy allows it, prompts are encoded once per group
    (:mod:`learners.common.shared_prefix`), with identical results.
    """
    total = 0.0
    # The group size when the groups share their prompts (None: score rows one by one).
    shared = group_size if group_size is not None and _groups_share_prompts(policy, prompt_ids, group_size) else None
    # Shared prompts: chunks hold whole groups (at least one), each prompt encoded once.
    chunk = max(shared, micro_batch_size - micro_batch_size % shared) if shared is not None else micro_batch_size
    for idx in _index_chunks(len(prompt_ids), chunk):
        if all(len(completion_ids[i]) == 0 for i in idx):
            continue  # nothing to score: no gradient either
        if shared is not None:
            starts = range(idx.start, idx.stop, shared)
            logp, mask = shared_prefix_token_logprobs(
                policy,
                [prompt_ids[s] for s in starts],
                [[completion_ids[i] for i in range(s, s + shared)] for s in starts],
            )
        else:
            logp, mask = policy.token_logprobs([prompt_ids[i] for i in idx], [completion_ids[i] for i in idx])
        loss = loss_fn(logp, mask, idx)
        if on_loss is not None and not on_loss(loss):
            return float("nan")
        loss.backward()
        total += float(loss.detach().item())
    return total
