"""Frozen reference policies for KL terms.

* A LoRA agent's reference is its own base model with the adapters switched off (peft's
  ``disable_adapter``): no extra memory.
* Any other trainable policy is deep-copied once and frozen (one more model in memory).
* :func:`frozen_references` with ``devices`` puts the references on devices of their own
  (CoMLRL's ``reference_devices``): frozen copies there (a LoRA copy scores with its
  adapters off), whose log-probs come back on the live policy's device.
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


class DeviceReference(Policy):
    """A frozen reference on another device; ``token_logprobs`` answers on ``output_device``
    (the live policy's), so the KL term compares tensors on one device."""

    trainable = False

    def __init__(self, reference: Policy, output_device: torch.device | str | None) -> None:
        self.reference = reference
        self.output_device = output_device
        self.name = reference.name

    def generate(self, prompts, num_samples=1, generation_config=None, seed=None):
        raise NotImplementedError("a reference policy only scores completions")

    @torch.no_grad()
    def token_logprobs(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]):
        logp, mask = self.reference.token_logprobs(prompt_ids, completion_ids)
        if self.output_device is None:
            return logp, mask
        return logp.to(self.output_device), mask.to(self.output_device)

    def parameters(self):
        return self.reference.parameters()


def frozen_references(policies: Sequence[Policy], devices: Sequence[str] | None = None) -> list[Policy]:
    """One frozen reference per policy. ``devices`` (None: each policy's own device, see
    :func:`frozen_reference`): one device for all, or one per policy; the references are
    then frozen copies moved there (agents sharing a LoRA base share one copy of it, so
    they need one device)."""
    if not devices:
        return [frozen_reference(p) for p in policies]
    if len(devices) not in (1, len(policies)):
        raise ValueError(
            f"reference_devices names {len(devices)} devices for {len(policies)} agents; give one or one per agent"
        )
    per_agent = [devices[0]] * len(policies) if len(devices) == 1 else list(devices)
    shared: dict[int, str] = {}
    for policy, device in zip(policies, per_agent, strict=True):
        base = getattr(policy, "shared_base", None)
        if base is not None and shared.setdefault(id(base), device) != device:
            raise ValueError(
                "reference_devices puts agents that share one LoRA base on different devices; "
                "give those agents one device"
            )
    outputs = [p.device for p in policies]
    copies = copy.deepcopy(list(policies))  # one memo: a shared base is copied once
    out: list[Policy] = []
    for ref, device, output in zip(copies, per_agent, outputs, strict=True):
        for param in ref.parameters():
            param.requires_grad_(False)
        model = getattr(ref, "model", None)
        if model is not None and hasattr(model, "to"):
            model.to(device)
        base_model = getattr(getattr(ref, "shared_base", None), "model", None)
        lora = getattr(ref, "is_lora", False) and hasattr(base_model, "disable_adapter")
        out.append(DeviceReference(AdapterOffReference(ref) if lora else ref, output))
    return out


def frozen_reference(policy: Policy) -> Policy:
    """The reference for ``policy`` as it is now (see the module docstring)."""
    shared = getattr(policy, "shared_base", None)
    if getattr(policy, "is_lora", False) and hasattr(getattr(shared, "model", None), "disable_adapter"):
        return AdapterOffReference(policy)
    ref = copy.deepcopy(policy)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
