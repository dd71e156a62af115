"""Frozen references on devices of their own (``reference_devices``)."""

from __future__ import annotations

import pytest
import torch

from comlrl_core.policy import Policy
from learners.common.reference import DeviceReference, frozen_reference, frozen_references


class LinearPolicy(Policy):
    """Scores every completion token with one linear layer (enough to follow devices)."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Linear(1, 1)
        self.name = f"linear{seed}"

    def generate(self, prompts, num_samples=1, generation_config=None, seed=None):
        raise NotImplementedError

    def token_logprobs(self, prompt_ids, completion_ids):
        weight = self.model.weight.reshape(())
        x = torch.tensor(completion_ids, dtype=torch.float32, device=weight.device)
        return x * weight, torch.ones_like(x)

    def parameters(self):
        return self.model.parameters()

    @property
    def device(self):
        return self.model.weight.device


def test_references_move_to_their_device_and_answer_on_the_policys():
    live = [LinearPolicy(1), LinearPolicy(2)]
    refs = frozen_references(live, ["meta"])
    for ref, pol in zip(refs, live, strict=True):
        assert isinstance(ref, DeviceReference)
        assert ref.reference.model.weight.device.type == "meta"  # the copy moved
        assert pol.model.weight.device.type == "cpu" and pol.model.weight.requires_grad  # the live one did not
        assert not ref.reference.model.weight.requires_grad
        assert ref.output_device == pol.device


def test_reference_logprobs_come_back_on_the_live_device():
    live = LinearPolicy(3)
    ref = frozen_references([live], ["cpu"])[0]
    logp, mask = ref.token_logprobs([[1]], [[2, 3]])
    assert logp.device == live.device and torch.allclose(logp, live.token_logprobs([[1]], [[2, 3]])[0].detach())
    assert ref.reference is not live


def test_without_devices_the_plain_reference_and_device_count_errors():
    live = [LinearPolicy(4), LinearPolicy(5)]
    assert not isinstance(frozen_references(live)[0], DeviceReference)
    assert type(frozen_reference(live[0])) is LinearPolicy
    with pytest.raises(ValueError, match="reference_devices"):
        frozen_references(live, ["cpu", "cpu", "cpu"])
