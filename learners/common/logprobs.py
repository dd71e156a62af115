"""Batched, memory-bounded log-prob passes over a policy's completions.

Learners score many completions per update. These helpers run ``Policy.token_logprobs``
on micro-batches of at most ``micro_batch_size`` sequences and, when ``token_budget`` is
given, at most that many padded tokens (one sequence or group alone may exceed it), so
peak activation memory is bounded by one micro-batch while the work stays batched.

Why a token budget: training activations grow with tokens, not sequences. SmolLM2-135M
with LoRA on every linear layer keeps about 1.25 MB of activations per token for the
backward pass, so 16 sequences of 500 tokens hold 10 GB while 2048 tokens hold 2.5 GB.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from comlrl_core.models.cpu.memory_stats import end_of_micro_batch
from comlrl_core.models.tokens import plan_chunks
from comlrl_core.policy import Policy
from learners.common.shared_prefix import shared_prefix_token_logprobs, supports_shared_prefix


def _row_widths(prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]) -> list[int]:
    return [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids, strict=True)]


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
    token_budget: int | None = None,
) -> list[torch.Tensor]:
    """Per-token log-probs (real tokens only, 1-D per completion), without gradients."""
    out: list[torch.Tensor] = []
    for idx in plan_chunks(_row_widths(prompt_ids, completion_ids), 1, micro_batch_size, token_budget):
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
    token_budget: int | None = None,
) -> float:
    """Run ``loss_fn(token_logprobs, mask, indices)`` per micro-batch and backpropagate.

    ``loss_fn`` must return the micro-batch's share of the total loss (shares add up).
    ``on_loss`` sees each share before its backward and may veto it (return False), which
    stops the pass (e.g. on a NaN). Returns the summed loss value (NaN if vetoed).
    ``group_size``: consecutive rows come in groups of this size; when each group shares
    one prompt and the policy allows it, prompts are encoded once per group
    (:mod:`learners.common.shared_prefix`), with identical results.
    ``token_budget``: padded tokens per micro-batch (see :func:`plan_chunks`).
    """
    total = 0.0
    # The group size when the groups share their prompts (None: score rows one by one).
    shared = group_size if group_size is not None and _groups_share_prompts(policy, prompt_ids, group_size) else None
    # Shared prompts: chunks hold whole groups (at least one), each prompt encoded once, so
    # a group costs its prompt once plus its completions.
    if shared is not None:
        widths = [
            len(prompt_ids[s]) + shared * max(len(completion_ids[i]) for i in range(s, s + shared))
            for s in range(0, len(prompt_ids), shared)
        ]
        chunks = plan_chunks(widths, shared, max(shared, micro_batch_size), token_budget)
    else:
        chunks = plan_chunks(_row_widths(prompt_ids, completion_ids), 1, micro_batch_size, token_budget)
    for idx in chunks:
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
        del logp, mask, loss
        end_of_micro_batch()  # its activations are freed: inside training at level micro_batch, handed back
    return total
