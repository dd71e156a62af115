"""Optimizer steps of the actor-critic learners on flat sample lists.

A :class:`Samples` holds one learner's view of an update round: per sample the actor's
prompt / completion ids (when an actor learns from it), the critic's encoded input,
the advantage, the critic target and the value the target was built with.
:func:`minibatches` splits it turn by turn into shuffled batches;
:func:`optimize_batch` runs one optimizer step on a batch, micro-batched so that the
summed micro-batch losses equal the batch loss exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from comlrl_core.models.tokens import plan_chunks
from learners.actor_critic.critics import Critic
from learners.actor_critic.losses import actor_loss_terms, check_finite, value_loss_terms
from learners.common.optim import note_grad_norm


@dataclass
class Samples:
    turns: list[int] = field(default_factory=list)
    prompt_ids: list[list[int]] = field(default_factory=list)
    completion_ids: list[list[int]] = field(default_factory=list)
    critic_rows: list[list[int]] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    targets: list[float] = field(default_factory=list)
    old_values: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.turns)


def minibatches(turns: Sequence[int], batch_size: int | None, rng: random.Random) -> list[list[int]]:
    """Sample indices grouped by turn (ascending), shuffled, in chunks of ``batch_size``
    (None: one chunk per turn)."""
    out: list[list[int]] = []
    for turn in sorted(set(turns)):
        idx = [i for i, t in enumerate(turns) if t == turn]
        rng.shuffle(idx)
        size = batch_size or len(idx)
        out.extend(idx[s : s + size] for s in range(0, len(idx), size))
    return out


@dataclass
class StepResult:
    actor_loss: float | None  # mean per-sample actor loss of the batch
    value_loss: float | None  # mean per-sample (clipped) squared error


def optimize_batch(
    samples: Samples,
    batch: Sequence[int],
    *,
    optimizers: Sequence[torch.optim.Optimizer],
    policy: Any = None,
    critic: Critic | None = None,
    value_loss_coef: float,
    value_clip_range: float | None,
    micro_batch_size: int,
    max_grad_norm: float | None,
    step: int,
    who: str,
    token_budget: int | None = None,
) -> StepResult:
    """One step of every optimizer in ``optimizers`` on ``batch`` (indices into samples).

    Loss = mean over the batch of ``actor`` (when ``policy`` is given) plus
    ``value_loss_coef * critic`` (when ``critic`` is given); one backward serves both,
    so a value head on the actor also shapes the actor's trunk. Micro-batches hold at most
    ``micro_batch_size`` samples and ``token_budget`` padded tokens (see
    :func:`learners.common.logprobs.plan_chunks`).
    """
    if policy is None and critic is None:
        raise ValueError("optimize_batch needs a policy, a critic, or both")
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    n = len(batch)
    actor_sum = value_sum = 0.0
    widths = [
        max(
            len(samples.prompt_ids[i]) + len(samples.completion_ids[i]) if policy is not None else 0,
            len(samples.critic_rows[i]) if critic is not None else 0,
        )
        for i in batch
    ]
    for chunk in plan_chunks(widths, 1, micro_batch_size, token_budget):
        idx = [batch[k] for k in chunk]
        loss = torch.zeros(())
        if policy is not None:
            logp, mask = policy.token_logprobs(
                [samples.prompt_ids[i] for i in idx], [samples.completion_ids[i] for i in idx]
            )
            adv = torch.tensor([samples.advantages[i] for i in idx], dtype=torch.float32)
            terms = actor_loss_terms(logp, mask, adv)
            actor_sum += float(terms.detach().sum())
            loss = loss.to(terms.device) + terms.sum()
        if critic is not None:
            values = critic.values([samples.critic_rows[i] for i in idx])
            terms = value_loss_terms(
                values,
                torch.tensor([samples.targets[i] for i in idx], dtype=torch.float32),
                torch.tensor([samples.old_values[i] for i in idx], dtype=torch.float32),
                value_clip_range,
            )
            value_sum += float(terms.detach().sum())
            loss = loss.to(terms.device) + value_loss_coef * terms.sum()
        loss = loss / n
        try:
            check_finite(loss, what="actor-critic loss", step=step, agent=who)
        except FloatingPointError:
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            raise
        loss.backward()
    for opt in optimizers:
        if max_grad_norm is not None:
            params = [p for g in opt.param_groups for p in g["params"]]
            # logged grad_norm: the norm before clipping, as TRL's
            note_grad_norm(opt, torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return StepResult(
        actor_sum / n if policy is not None else None,
        value_sum / n if critic is not None else None,
    )
