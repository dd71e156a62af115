"""One optimizer step of one agent on a mini-batch of node groups.

Steps: optional KL shaping (k3 to a frozen reference, subtracted from each response's
return), group advantages, then the policy-gradient loss accumulated over micro-batches
(``logprob_micro_batch_size`` sequences per forward) and one AdamW step.

A group whose advantages are all zero (identical returns under a baselined mode, or all
zero returns under ``raw``) contributes exactly nothing to the loss and its gradient, so
it is not scored at all: no forward, no backward. The step itself still happens (on
whatever the other groups give, zeros if none), because Adam's moments move the weights
even on a zero gradient, as they would had the group been scored. TRL reports the same
quantity as ``frac_reward_zero_std``; here it is ``agent_i/zero_advantage_frac``.

[distributed] ``group_count`` is the number of groups in the update over ALL processes
and ``sync_gradients`` sums the gradients over the processes before clipping and
stepping (see :mod:`learners.magrpo.data_parallel`); a process's ``groups`` may be empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from comlrl_core.models.tokens import k3_kl
from comlrl_core.policy import Policy
from learners.common.logprobs import accumulate_gradients, sequence_logprobs_nograd
from learners.common.optim import note_grad_norm
from learners.magrpo.advantages import group_advantages
from learners.magrpo.groups import NodeGroup
from learners.magrpo.losses import NonFiniteLossError, check_finite, sequence_pg_loss


@dataclass
class UpdateResult:
    loss: float  # NaN when skipped
    skipped: bool
    kl_mean: float | None
    advantage_abs_mean: float
    zero_advantage_groups: int  # groups not scored: every coefficient zero
    num_groups: int


def k3_per_sequence(policy_lp: Sequence[torch.Tensor], ref_lp: Sequence[torch.Tensor]) -> list[float]:
    """Summed k3 KL of each sequence (inputs: 1-D per-token log-probs of real tokens)."""
    return [
        float(k3_kl(lp.unsqueeze(0), ref.unsqueeze(0), torch.ones(1, lp.numel()))[0])
        for lp, ref in zip(policy_lp, ref_lp, strict=True)
    ]


def _common_group_size(groups: Sequence[NodeGroup]) -> int | None:
    sizes = {len(g.completion_ids) for g in groups}
    return sizes.pop() if len(sizes) == 1 else None


def groups_with_signal(groups: Sequence[NodeGroup], coef: torch.Tensor) -> tuple[list[NodeGroup], torch.Tensor]:
    """The groups with at least one nonzero loss coefficient, and their coefficients (in
    the order of ``coef``, which holds every group's responses in turn). A NaN counts as
    nonzero, so a broken return still reaches the finiteness check."""
    kept: list[NodeGroup] = []
    kept_coef: list[torch.Tensor] = []
    start = 0
    for group in groups:
        part = coef[start : start + len(group.completion_ids)]
        start += len(group.completion_ids)
        if bool((part != 0).any()):
            kept.append(group)
            kept_coef.append(part)
    return kept, torch.cat(kept_coef) if kept_coef else coef[:0]


def _zero_missing_gradients(params: Sequence[torch.Tensor]) -> None:
    # an update with nothing scored still steps: the optimizer must see a zero gradient
    # (which scoring the groups would have given every trainable weight), not none
    for p in params:
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)


# sync_gradients(params, finite) -> whether to step (False: some process saw a non-finite loss)
GradientSync = Callable[[Sequence[torch.Tensor], bool], bool]


def kl_shaped_returns(
    policy: Policy,
    reference: Policy | None,
    groups: Sequence[NodeGroup],
    reference_kl_coef: float,
    micro_batch_size: int,
    token_budget: int | None = None,
) -> tuple[list[list[float]], float | None]:
    """Each group's returns, minus ``reference_kl_coef`` times each response's k3 KL to the
    reference when the coefficient is positive; and the mean KL (None without the term)."""
    returns = [list(g.returns) for g in groups]
    if reference_kl_coef <= 0:
        return returns, None
    if reference is None:
        raise ValueError("reference_kl_coef > 0 needs a reference policy")
    prompts = [p for g in groups for p in g.prompt_ids]
    comps = [c for g in groups for c in g.completion_ids]
    kls = k3_per_sequence(
        sequence_logprobs_nograd(policy, prompts, comps, micro_batch_size, token_budget),
        sequence_logprobs_nograd(reference, prompts, comps, micro_batch_size, token_budget),
    )
    flat = iter(kls)
    shaped = [[r - reference_kl_coef * next(flat) for r in group] for group in returns]
    return shaped, sum(kls) / max(1, len(kls))


def loss_coefficients(
    returns: Sequence[Sequence[float]], advantage_mode: str, normalize_advantage: bool, num_groups: int
) -> tuple[torch.Tensor, float]:
    """Per response ``A / (G * num_groups)``: the loss is the mean over groups of each
    group's mean response loss. Also the mean over groups of ``|A|``."""
    coefs: list[float] = []
    adv_abs = 0.0
    for r in returns:
        adv = group_advantages(list(r), advantage_mode, normalize_advantage)
        adv_abs += float(adv.abs().mean()) / len(returns)
        coefs.extend((adv / (len(r) * num_groups)).tolist())
    return torch.tensor(coefs, dtype=torch.float32), adv_abs


def update_agent(
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    groups: Sequence[NodeGroup],
    *,
    advantage_mode: str,
    normalize_advantage: bool,
    micro_batch_size: int,
    step: int,
    agent: int,
    token_budget: int | None = None,
    reference: Policy | None = None,
    reference_kl_coef: float = 0.0,
    skip_nonfinite: bool = False,
    max_grad_norm: float | None = None,
    group_count: int | None = None,
    sync_gradients: GradientSync | None = None,
) -> UpdateResult:
    """One optimizer step on ``groups`` (``group_count``: all processes' groups, default
    ``len(groups)``). A non-finite loss raises :class:`NonFiniteLossError`, or with
    ``skip_nonfinite`` skips the step (``UpdateResult.skipped``)."""
    returns, kl_mean = kl_shaped_returns(policy, reference, groups, reference_kl_coef, micro_batch_size, token_budget)
    coef, adv_abs = loss_coefficients(returns, advantage_mode, normalize_advantage, group_count or len(returns))

    def veto(loss: torch.Tensor) -> bool:
        try:
            return check_finite(loss, step=step, agent=agent)
        except NonFiniteLossError:
            if skip_nonfinite:
                return False
            optimizer.zero_grad(set_to_none=True)
            raise

    scored, coef = groups_with_signal(groups, coef)
    optimizer.zero_grad(set_to_none=True)
    loss = accumulate_gradients(
        policy,
        [p for g in scored for p in g.prompt_ids],
        [c for g in scored for c in g.completion_ids],
        lambda lp, mask, idx: sequence_pg_loss(lp, mask, coef[idx.start : idx.stop]),
        micro_batch_size,
        on_loss=veto,
        group_size=_common_group_size(scored),
        token_budget=token_budget,
    )
    params = [p for group in optimizer.param_groups for p in group["params"]]
    finite = loss == loss  # NaN: vetoed and skipping
    if not scored:
        _zero_missing_gradients(params)
    counts = {"zero_advantage_groups": len(groups) - len(scored), "num_groups": len(groups)}
    if sync_gradients is not None:  # [distributed] all processes skip together on a NaN anywhere
        finite = sync_gradients(params, finite)
    if not finite:
        optimizer.zero_grad(set_to_none=True)
        return UpdateResult(float("nan"), True, kl_mean, adv_abs, **counts)
    if max_grad_norm is not None:  # logged grad_norm: the norm before clipping, as TRL's
        note_grad_norm(optimizer, torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return UpdateResult(loss, False, kl_mean, adv_abs, **counts)
