"""Actor and critic losses of IAC / MAAC.

Actor (per sample): ``-A * sum_k log pi(token_k)`` over the completion's real tokens
(EOS included, pads never); the advantage is a constant.

Critic (per sample): ``(v - y)^2``, or with ``value_clip_range = c`` the PPO-style
clipped form ``max((v - y)^2, (v_old + clip(v - v_old, -c, c) - y)^2)``, which keeps one
update from moving a value estimate far from the one the targets were built with.

Both return per-sample losses; callers sum shares of a batch (see the trainers), so a
batch split into micro-batches gives exactly the loss and gradient of the whole.
"""

from __future__ import annotations

import math

import torch

from comlrl_core.models.tokens import masked_sum


def actor_loss_terms(token_logprobs: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """Per-sample ``-A * sum(log pi)`` over real tokens; ``[B]``."""
    adv = advantages.to(token_logprobs.device, token_logprobs.dtype).detach()
    if adv.shape[0] != token_logprobs.shape[0]:
        raise ValueError(f"{adv.shape[0]} advantages for {token_logprobs.shape[0]} completions")
    return -adv * masked_sum(token_logprobs, mask.to(token_logprobs.device))


def value_loss_terms(
    values: torch.Tensor,
    targets: torch.Tensor,
    old_values: torch.Tensor | None = None,
    value_clip_range: float | None = None,
) -> torch.Tensor:
    """Per-sample squared error, clipped around ``old_values`` when a range is given; ``[B]``."""
    targets = targets.to(values.device, values.dtype).detach()
    if values.shape != targets.shape:
        raise ValueError(f"values {tuple(values.shape)} and targets {tuple(targets.shape)} differ")
    unclipped = (values - targets) ** 2
    if value_clip_range is None:
        return unclipped
    if old_values is None:
        raise ValueError("value_clip_range needs the old values the targets were built with")
    old = old_values.to(values.device, values.dtype).detach()
    clipped = old + torch.clamp(values - old, -value_clip_range, value_clip_range)
    return torch.maximum(unclipped, (clipped - targets) ** 2)


class NonFiniteLossError(FloatingPointError):
    """A NaN / Inf loss: the update is refused so the weights stay finite."""


def check_finite(loss: torch.Tensor, *, what: str, step: int, agent: int | str) -> None:
    value = float(loss.detach().item())
    if not math.isfinite(value):
        raise NonFiniteLossError(
            f"non-finite {what} ({value}) at step {step} for {agent}; lower the learning rates "
            "(agent_learning_rate / critic_learning_rate), check the reward scale, or set "
            "max_grad_norm"
        )
