"""Fixtures for the actor-critic tests: a fresh two-agent tiny-random team on CPU."""

from __future__ import annotations

import pytest
import torch

from comlrl_core.models.agent_spec import AgentSpec
from comlrl_core.models.team import Team

ENV = "comlrl/Writing-v0"
AGENTS = ("summarizer", "expander")


def short_prompts(chars: int = 160) -> dict:
    """env_kwargs whose formatters keep each prompt's last ``chars`` characters (the role
    text), so tiny-model forward passes stay cheap."""
    return {"formatters": {a: (lambda p, n=chars: p[-n:]) for a in AGENTS}}


@pytest.fixture
def team() -> Team:
    torch.manual_seed(0)
    return Team.from_specs([AgentSpec(model="tiny-random", device="cpu") for _ in AGENTS])


def base_options(tmp_path, **overrides) -> dict:
    opts = dict(
        num_turns=1,
        num_generations=1,
        max_new_tokens=3,
        temperature=1.0,
        top_p=1.0,
        rollout_buffer_size=2,
        eval_interval=0,
        output_dir=str(tmp_path / "run"),
        device="cpu",
        agent_learning_rate=1e-3,
        critic_learning_rate=1e-3,
        seed=0,
        env_kwargs=short_prompts(),
    )
    opts.update(overrides)
    return opts
