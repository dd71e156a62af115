"""Frozen reference policies for KL terms.

* A LoRA agent's reference is its own base model with the adapters switched off (peft's
  ``disable_adapter``): no extra memory.
* Any other trainable policy is deep-copied once and frozen (one more model in memory).
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch

from comlrl_core.policy import Policy


class AdapterOffReference(Policy):
    """Scores with ``policy``'s base weights only (its LoRA adapter disabled)."""

    trainable = False

    def __init__(self, policy: Policy) -> None:
        # the PeftModel of the policy's shared LoRA base (TransformersPolicy.shared_base.model)
        peft_model: Any = getattr(getattr(policy, "shared_base", None), "model", None)
        if not hasattr(peft_model, "disable_adapter"):
            raise TypeError(f"policy {policy.name!r} has no shared LoRA base whose adapters can be switched off")
        self.policy = policy
        self.peft_model = peft_model
        self.name = f"{policy.name}[reference]"

    def generate(self, prompts, num_samples=1, generation_config=None, seed=None):
        raise NotImplementedError("a reference policy only scores completions")

    @torch.no_grad()
    def token_logprobs(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]):
        with self.peft_model.disable_adapter():
            return self.policy.token_logprobs(prompt_ids, completion_ids)


def frozen_reference(policy: Policy) -> Policy:
    """The reference for ``policy`` as it is now (see the module docstring)."""
    shared = getattr(policy, "shared_base", None)
    if getattr(policy, "is_lora", False) and hasattr(getattr(shared, "model", None), "disable_adapter"):
        return AdapterOffReference(policy)
    ref = copy.deepcopy(policy)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
