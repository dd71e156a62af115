"""Returns on the rollout tree, per-agent credit, and group advantages.

Return of a joint action at turn t: ``R = r_t + discount * mean(returns of the child
node's joint actions)``, or ``r_t`` when its branch ended. ``discount`` defaults to 1.0
and any given value is used as is.

Credit: agent i's response g at a node is credited with the mean return of the joint
actions that contain it. In ``aligned`` mode that is exactly the return of joint action
g; in ``cross`` mode it averages the G**(N-1) joint actions sharing that response
(CoMLRL sums them instead, which scales advantages by G**(N-1); we average).

Advantage modes, computed within each node group (the G responses of one agent at one
node):

* ``mean`` (MAGRPO): ``R - mean(R)``
* ``raw`` (MAREINFORCE): ``R`` (no baseline)
* ``rloo`` (MARLOO): ``R - mean of the other G-1 returns`` = ``G/(G-1) * (R - mean(R))``
* ``max`` (MAReMax): ``R - max(R)``

``normalize=True`` divides by the group's return std (+eps), GRPO-style. It is off by
default so the four modes really differ; with it on ``mean`` and ``rloo`` coincide up
to the constant factor G/(G-1) (and, under Adam's scale invariance, give nearly the same
updates).

A group whose returns are all equal gets exactly zero advantages in every mode but
``raw``, normalised or not; such a group adds nothing to the gradient, so the update does
not score it (:func:`learners.magrpo.update.update_agent`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from learners.magrpo.tree import RolloutTree, TreeNode

ADVANTAGE_MODES = ("mean", "raw", "rloo", "max")


def compute_returns(tree: RolloutTree, discount: float = 1.0) -> None:
    """Fill ``JointAction.ret`` bottom-up (deepest level first)."""
    for level in reversed(tree.levels):
        for node in level:
            for joint in node.joints:
                if joint.child is not None and joint.child.joints:
                    child_mean = sum(j.ret for j in joint.child.joints) / len(joint.child.joints)
                    joint.ret = joint.reward + discount * child_mean
                else:
                    joint.ret = joint.reward


def agent_credits(node: TreeNode, agent: int) -> list[float]:
    """Mean return of the joint actions containing each of ``agent``'s responses."""
    num = len(node.completions[agent])
    sums = [0.0] * num
    counts = [0] * num
    for joint in node.joints:
        g = joint.indices[agent]
        sums[g] += joint.ret
        counts[g] += 1
    return [s / c if c else 0.0 for s, c in zip(sums, counts, strict=True)]


def node_mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def group_advantages(
    returns: torch.Tensor | Sequence[float],
    mode: str = "mean",
    normalize: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantages of one group of returns (1-D) under ``mode``; see the module docstring."""
    r = torch.as_tensor(returns, dtype=torch.float32)
    if r.dim() != 1:
        raise ValueError(f"group_advantages expects a 1-D group of returns, got shape {tuple(r.shape)}")
    g = r.numel()
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"advantage mode must be one of {ADVANTAGE_MODES}, got {mode!r}")
    if mode != "raw" and g > 0 and bool((r == r[0]).all()):
        # identical returns: every baseline equals them, so the advantages are exactly zero
        # (``r - r.mean()`` can be off by an ulp), and the update skips the group
        return torch.zeros_like(r)
    if mode == "mean":
        adv = r - r.mean()
    elif mode == "raw":
        adv = r.clone()
    elif mode == "rloo":
        # With a single sample there is no "other" sample: fall back to zero advantage.
        adv = (r * g - r.sum()) / (g - 1) if g > 1 else torch.zeros_like(r)
    else:  # max
        adv = r - r.max()
    if normalize and g > 1:
        adv = adv / (r.std(unbiased=False) + eps)
    return adv
