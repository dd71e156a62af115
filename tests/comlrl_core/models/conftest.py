"""Fixtures shared by the model tests."""

from __future__ import annotations

import pytest
import torch

from comlrl_core.models.agent_spec import AgentSpec
from comlrl_core.models.team import Team


@pytest.fixture(scope="module")
def lora_team():
    """Two LoRA agents of the tiny model on one shared base, adapters made to differ."""
    torch.manual_seed(0)
    team = Team.from_specs([AgentSpec(model="tiny-random", lora=True), AgentSpec(model="tiny-random", lora=True)])
    for policy in team:  # fresh adapters are zero: make the agents differ
        for name, weight in policy.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(weight, std=0.5)
    return team
