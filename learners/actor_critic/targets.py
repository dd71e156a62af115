"""One-step TD targets and advantages for whole episodes (pure functions, no model).

For one episode of T turns with rewards ``r_0..r_{T-1}`` and critic estimates
``v_0..v_{T-1}`` (V(h_t), or Q(h_t, a_t) for a Q critic), the critic's target is

    y_t = r_t + discount * v_{t+1}     for t < T-1
    y_{T-1} = r_{T-1}                  (no bootstrap after the last turn played,
                                        whether the episode was truncated or ended early)

Advantages:

* V critic: ``A_t = y_t - V(h_t)`` (the one-step TD error).
* Q critic: ``A_t = Q(h_t, a_t) - b_t`` with ``b_t`` the mean Q of the samples that share
  the baseline group (same update batch and turn). CoMLRL uses ``y_t - Q(h_t, a_t)``
  for Q as well, which tends to 0 for every action once Q fits, so the actor stops
  learning; we use Q itself against a mean baseline instead.
"""

from __future__ import annotations

from typing import Sequence

import torch

CRITIC_TYPES = ("v", "q")


def td_targets(rewards: Sequence[float], values: Sequence[float], discount: float) -> list[float]:
    """``y_t = r_t + discount * values[t+1]``, and ``y_{T-1} = r_{T-1}`` (no bootstrap)."""
    if len(rewards) != len(values):
        raise ValueError(f"an episode has {len(rewards)} rewards but {len(values)} values")
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount}")
    last = len(rewards) - 1
    return [float(r) + (discount * float(values[t + 1]) if t < last else 0.0) for t, r in enumerate(rewards)]


def discounted_returns(rewards: Sequence[float], discount: float) -> list[float]:
    """Monte-Carlo returns ``G_t = r_t + discount * G_{t+1}`` (for logging)."""
    out, running = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + discount * running
        out[t] = running
    return out


def v_advantages(targets: Sequence[float], values: Sequence[float]) -> list[float]:
    """TD errors ``y_t - V(h_t)``."""
    if len(targets) != len(values):
        raise ValueError(f"{len(targets)} targets but {len(values)} values")
    return [float(y) - float(v) for y, v in zip(targets, values, strict=True)]


def q_advantages(q_values: Sequence[float]) -> list[float]:
    """``Q - mean(Q)`` over one baseline group (a single sample gets 0)."""
    if not q_values:
        return []
    mean = sum(float(q) for q in q_values) / len(q_values)
    return [float(q) - mean for q in q_values]


def normalize(advantages: Sequence[float], eps: float = 1e-6) -> list[float]:
    """Zero mean, unit (population) std. Fewer than two values are returned unchanged
    (there is no spread to measure)."""
    if len(advantages) < 2:
        return [float(a) for a in advantages]
    t = torch.tensor([float(a) for a in advantages], dtype=torch.float64)
    std = t.std(unbiased=False).clamp(min=eps)
    return ((t - t.mean()) / std).tolist()


def update_targets(
    rewards: Sequence[Sequence[float]],
    values: Sequence[Sequence[float]],
    *,
    discount: float,
    critic_type: str,
    advantage_normalization: bool,
) -> tuple[list[list[float]], list[list[float]]]:
    """Critic targets and actor advantages for the episodes of one update round.

    ``rewards[e][t]`` / ``values[e][t]``: episode e, turn t (episodes may differ in
    length). Targets and V advantages are per episode; the Q baseline and the
    normalisation are taken over every episode's turn t (CoMLRL also normalises turn by
    turn).
    """
    if critic_type not in CRITIC_TYPES:
        raise ValueError(f"critic_type must be one of {CRITIC_TYPES}, got {critic_type!r}")
    if len(rewards) != len(values):
        raise ValueError(f"{len(rewards)} reward lists but {len(values)} value lists")
    targets = [td_targets(r, v, discount) for r, v in zip(rewards, values, strict=True)]
    if critic_type == "v":
        advantages = [v_advantages(y, v) for y, v in zip(targets, values, strict=True)]
    else:
        advantages = [[0.0] * len(v) for v in values]
    max_turns = max((len(v) for v in values), default=0)
    for t in range(max_turns):
        reached = [e for e in range(len(values)) if len(values[e]) > t]
        if critic_type == "q":
            for e, a in zip(reached, q_advantages([values[e][t] for e in reached]), strict=True):
                advantages[e][t] = a
        if advantage_normalization:
            for e, a in zip(reached, normalize([advantages[e][t] for e in reached]), strict=True):
                advantages[e][t] = a
    return targets, advantages
