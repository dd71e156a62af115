"""The MAGRPO policy-gradient loss and its guards.

Per node group (one agent's G responses at one node) the loss is

    L_group = (1/G) * sum_g  -A_g * sum_{real tokens k of response g} log pi(token_k)

where "real tokens" include EOS and never a pad. A train batch averages ``L_group`` over
its groups. Advantages are constants (no gradient flows through them). The trainer folds
``1/G`` and the batch average into one coefficient per response
(:func:`learners.magrpo.update.loss_coefficients`), so :func:`sequence_pg_loss` computes
the batch loss micro-batch by micro-batch.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from comlrl_core.models.tokens import masked_sum


class NonFiniteLossError(FloatingPointError):
    """Raised when a loss is NaN or Inf (unless the trainer skips such updates)."""


def sequence_pg_loss(
    token_logprobs: torch.Tensor,
    mask: torch.Tensor,
    coefficients: torch.Tensor | Sequence[float],
) -> torch.Tensor:
    """``sum_c -coef_c * sum_k logp_{c,k}`` over real tokens (mask 1).

    ``coefficients`` already include the advantage and the averaging weight of each
    completion (``A_c / (G * num_groups)``), so a batch can be split into micro-batches
    whose losses add up to the full loss.
    """
    coef = torch.as_tensor(coefficients, dtype=token_logprobs.dtype, device=token_logprobs.device)
    if coef.shape[0] != token_logprobs.shape[0]:
        raise ValueError(f"{coef.shape[0]} coefficients for {token_logprobs.shape[0]} completions")
    seq_logp = masked_sum(token_logprobs, mask.to(token_logprobs.device))
    return -(coef.detach() * seq_logp).sum()


def check_finite(value: float | torch.Tensor, *, step: int, agent: int, what: str = "loss") -> bool:
    """True when finite; otherwise raise :class:`NonFiniteLossError` naming step and agent."""
    number = float(value.detach().item()) if isinstance(value, torch.Tensor) else float(value)
    if math.isfinite(number):
        return True
    raise NonFiniteLossError(
        f"non-finite {what} ({number}) at step {step} for agent {agent}; "
        "check the reward scale and learning rate, or set skip_nonfinite=True to skip "
        "such updates and count them instead"
    )
