"""IACConfig / MAACConfig validation: errors name the option and the fix."""

from __future__ import annotations

import pytest

from comlrl_core.config.options import ConfigError
from learners.actor_critic import IACConfig, MAACConfig


@pytest.mark.parametrize("cls", [IACConfig, MAACConfig])
def test_multi_turn_needs_one_generation(cls):
    with pytest.raises(ConfigError, match="num_generations.*must be 1 when num_turns > 1.*Set num_generations=1"):
        cls(num_turns=2, num_generations=4)
    cls(num_turns=1, num_generations=4)  # single turn: several samples are fine
    cls(num_turns=3, num_generations=1)


@pytest.mark.parametrize("cls", [IACConfig, MAACConfig])
def test_critic_type_is_v_or_q(cls):
    with pytest.raises(ConfigError, match="critic_type"):
        cls(critic_type="a")
    assert cls(critic_type="q").critic_type == "q"


def test_q_critic_needs_two_episodes_per_update():
    with pytest.raises(ConfigError, match="rollout_buffer_size"):
        IACConfig(critic_type="q", rollout_buffer_size=1)


@pytest.mark.parametrize(
    "option,value",
    [
        ("value_clip_range", 0.0),
        ("value_loss_coef", -1.0),
        ("critic_learning_rate", 0.0),
        ("rollout_buffer_size", 0),
        ("discount", 1.5),
        ("train_batch_size", 0),
    ],
)
def test_bad_values_name_the_option(option, value):
    with pytest.raises(ConfigError, match=option):
        MAACConfig(**{option: value})


def test_critic_learning_rate_defaults_to_the_agents_when_none():
    cfg = IACConfig(agent_learning_rate=1e-4, critic_learning_rate=None)
    assert cfg.resolved_critic_learning_rate == 1e-4
    assert IACConfig(critic_learning_rate=3e-3).resolved_critic_learning_rate == 3e-3


def test_comlrl_option_names_and_overrides():
    cfg = IACConfig().with_overrides(["use_separate_critic=false", "value_clip_range=null", "critic_type=q"])
    assert cfg.use_separate_critic is False and cfg.value_clip_range is None and cfg.critic_type == "q"
    for name in [
        "num_turns",
        "num_generations",
        "discount",
        "rollout_buffer_size",
        "value_clip_range",
        "value_loss_coef",
        "advantage_normalization",
        "agent_learning_rate",
        "critic_learning_rate",
        "max_new_tokens",
        "temperature",
        "top_p",
        "critic_type",
        "critic_model",
    ]:
        assert hasattr(MAACConfig(), name)
    assert MAACConfig().value_clip_range is None and IACConfig().value_clip_range == 0.2
