"""The multi-agent DPO loss and one MADPO update.

For a pair with winner ``w`` and loser ``l`` (joint responses), agent i's margin is
``m_i = log pi_i(w_i | x_i) - log pi_i(l_i | x_i)`` and the joint margin is
``Delta = sum_i m_i``. The loss is ``-log sigmoid(eta * Delta)`` with ``eta = dpo_beta``;
there is no reference-policy term. Agent i's gradient flows only through its own margin:
in agent i's loss the other agents' margins enter as constants (detached), so

    d loss / d theta_i = -eta * sigmoid(-eta * Delta) * d m_i / d theta_i.

Margins count every real completion token (EOS included, pads never). With
``exclude_last_token=True`` the last real token of each completion is left out, which
reproduces CoMLRL's scoring (its log-prob pass feeds the completion without its last
token) for parity runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from comlrl_core.models.tokens import plan_chunks
from comlrl_core.policy import Policy
from learners.common.distributed import DistributedContext, trainable_parameters
from learners.preference.records import PreferencePair


def drop_last_real_token(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` ([B, C], 0/1, real tokens first) without each row's last real token."""
    lengths = mask.sum(dim=-1).long()
    positions = torch.arange(mask.size(-1), device=mask.device).unsqueeze(0)
    return mask * (positions < (lengths - 1).clamp(min=0).unsqueeze(-1)).to(mask.dtype)


def pair_margins(
    policy: Policy,
    prompt_ids: Sequence[Sequence[int]],
    winner_ids: Sequence[Sequence[int]],
    loser_ids: Sequence[Sequence[int]],
    exclude_last_token: bool = False,
) -> torch.Tensor:
    """``log pi(winner) - log pi(loser)`` per pair (``[P]``, differentiable), one forward pass."""
    n = len(prompt_ids)
    logp, mask = policy.token_logprobs(list(prompt_ids) * 2, list(winner_ids) + list(loser_ids))
    if logp.numel() == 0:
        return torch.zeros(n, device=logp.device)
    if exclude_last_token:
        mask = drop_last_real_token(mask)
    seq = (logp * mask).sum(dim=-1)
    return seq[:n] - seq[n:]


def agent_losses(margins: Sequence[torch.Tensor], beta: float) -> list[torch.Tensor]:
    """Per agent, the per-pair loss ``-log sigmoid(beta * Delta)`` whose graph reaches only that
    agent's own margins (the others are detached). All have the same value."""
    detached = [m.detach() for m in margins]
    total = torch.stack(detached).sum(dim=0)
    return [-F.logsigmoid(beta * (m + (total - d))) for m, d in zip(margins, detached, strict=True)]


@dataclass
class MADPOUpdate:
    loss: float  # mean -log sigmoid(beta * Delta) over the pairs
    accuracy: float  # fraction of pairs with Delta > 0 (before the step)
    margin_means: list[float]  # per agent, mean m_i
    skipped: bool = False  # a non-finite loss: no optimizer step


def _pair_ids(pair: PreferencePair) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """(prompt, winner, loser) token ids per agent (``with_token_ids`` gives a pair them)."""
    if pair.prompt_ids is None or pair.winner_ids is None or pair.loser_ids is None:
        raise ValueError("madpo_update needs pairs with token ids (learners.preference.build.with_token_ids)")
    return pair.prompt_ids, pair.winner_ids, pair.loser_ids


def madpo_update(
    policies: Sequence[Policy],
    optimizers: Sequence[torch.optim.Optimizer],
    pairs: Sequence[PreferencePair],
    beta: float,
    *,
    exclude_last_token: bool = False,
    micro_batch_size: int = 8,
    max_grad_norm: float | None = None,
    pair_count: int | None = None,
    distributed: DistributedContext | None = None,
    token_budget: int | None = None,
) -> MADPOUpdate:
    """One optimizer step per agent on ``pairs`` (mean loss over the pairs).

    Pairs are scored in micro-batches; each micro-batch's share of the loss is
    backpropagated at once, so peak memory is one micro-batch per agent. A micro-batch holds
    at most ``micro_batch_size`` pairs and ``token_budget`` padded tokens, counted over every
    agent's winner and loser sequences (their graphs are alive together until the backward).

    [distributed] ``pair_count`` is the number of pairs in the update over ALL processes
    (default ``len(pairs)``; the loss is divided by it) and ``distributed`` sums each
    agent's gradients over the processes before its step; ``pairs`` may then be empty here.
    """
    sync = distributed is not None and distributed.enabled
    if not pairs and not sync:
        raise ValueError("madpo_update needs at least one pair")
    n = pair_count or len(pairs)
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    total, correct, sums = 0.0, 0, [0.0] * len(policies)
    finite = True
    pair_ids = [_pair_ids(p) for p in pairs]
    widths = [
        sum(2 * (len(p) + max(len(w), len(lo))) for p, w, lo in zip(prompts, winners, losers, strict=True))
        for prompts, winners, losers in pair_ids
    ]
    for span in plan_chunks(widths, 1, micro_batch_size, token_budget):
        chunk = [pair_ids[k] for k in span]
        margins = [
            pair_margins(
                policy,
                [prompt[i] for prompt, _, _ in chunk],
                [winner[i] for _, winner, _ in chunk],
                [loser[i] for _, _, loser in chunk],
                exclude_last_token,
            )
            for i, policy in enumerate(policies)
        ]
        margins = [m.to(margins[0].device) for m in margins]
        losses = agent_losses(margins, beta)
        value = losses[0].detach()
        if not torch.isfinite(value).all():
            finite = False
            break
        torch.stack([loss.sum() for loss in losses]).sum().div(n).backward()
        total += float(value.sum())
        joint = torch.stack([m.detach() for m in margins]).sum(dim=0)
        correct += int((joint > 0).sum())
        for i, m in enumerate(margins):
            sums[i] += float(m.detach().sum())
    if sync and distributed is not None:  # [distributed] sum every agent's gradients and the figures
        for opt in optimizers:
            finite = distributed.sync_gradients(trainable_parameters(opt), finite)
        total, summed_correct, *sums = distributed.sum([total, correct, *sums])
        correct = int(summed_correct)
    if not finite:
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        return MADPOUpdate(float("nan"), float("nan"), [float("nan")] * len(policies), skipped=True)
    for opt in optimizers:
        if max_grad_norm is not None:
            params = [p for g in opt.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
    return MADPOUpdate(total / n, correct / n, [s / n for s in sums])
