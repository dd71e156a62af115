"""CoMLRL's ``external:`` YAML section and the ``external_prompt_passthrough`` learner option."""

from __future__ import annotations

import pytest
from magrpo_fakes import BigramPolicy, CountingEnv, FakeTeam

from comlrl_core.config.options import ConfigError
from learners.actor_critic.ac_config import IACConfig, MAACConfig
from learners.common.external_options import fold_external_section
from learners.madpo import MADPOConfig
from learners.magrpo import MAGRPOConfig, MAGRPOTrainer


def test_fold_maps_mode_to_external_transition_and_keeps_other_keys():
    data = {"seed": 1, "external": {"mode": "level_feedback", "sandbox_slice": 2}}
    assert fold_external_section(data) == {
        "seed": 1,
        "env_kwargs": {"external_transition": "level_feedback", "sandbox_slice": 2},
    }
    assert fold_external_section({"seed": 1}) == {"seed": 1}
    with pytest.raises(ConfigError, match="external"):
        fold_external_section({"external": "level_feedback"})


@pytest.mark.parametrize("config_cls", [MAGRPOConfig, MAACConfig, IACConfig, MADPOConfig])
def test_yaml_external_section_reaches_env_kwargs(tmp_path, config_cls):
    path = tmp_path / "comlrl.yaml"
    path.write_text(
        "num_turns: 1\nenv_kwargs: {dataset: humaneval}\nexternal:\n  mode: level_feedback\n  sandbox_slice: -1\n"
    )
    cfg = config_cls.from_yaml(path)
    assert cfg.env_kwargs == {"dataset": "humaneval", "external_transition": "level_feedback", "sandbox_slice": -1}
    assert config_cls.from_dict(cfg.to_dict()).env_kwargs == cfg.env_kwargs  # round trip


def test_external_mode_disagreeing_with_env_kwargs_is_an_error():
    with pytest.raises(ConfigError, match="external.mode"):
        MAGRPOConfig.from_dict({"external": {"mode": "plain"}, "env_kwargs": {"external_transition": "level_feedback"}})
    same = {"external": {"mode": "plain"}, "env_kwargs": {"external_transition": "plain"}}
    assert MAGRPOConfig.from_dict(same).env_kwargs == {"external_transition": "plain"}


@pytest.mark.parametrize("config_cls", [MAGRPOConfig, MAACConfig])
def test_passthrough_in_both_places_must_agree(config_cls):
    with pytest.raises(ConfigError, match="external_prompt_passthrough"):
        config_cls(external_prompt_passthrough=True, env_kwargs={"external_prompt_passthrough": False})
    with pytest.raises(ConfigError, match="external_prompt_passthrough"):
        config_cls.from_dict({"external": {"external_prompt_passthrough": False}, "external_prompt_passthrough": True})
    config_cls(external_prompt_passthrough=True, env_kwargs={"external_prompt_passthrough": True})


def test_magrpo_override_of_the_option_replaces_the_value_it_handed_on():
    cfg = MAGRPOConfig(external_prompt_passthrough=True)
    assert cfg.env_kwargs == {"external_prompt_passthrough": True}
    off = cfg.with_overrides(["external_prompt_passthrough=false"])
    assert off.external_prompt_passthrough is False and off.env_kwargs == {}
    assert MAGRPOConfig.from_dict(cfg.to_dict()).env_kwargs == cfg.env_kwargs


def test_actor_critic_reads_the_env_kwargs_entry_into_the_option():
    cfg = MAACConfig(env_kwargs={"external_prompt_passthrough": True, "dataset": "mbpp"})
    assert cfg.external_prompt_passthrough is True and cfg.env_kwargs == {"dataset": "mbpp"}
    assert MAACConfig().external_prompt_passthrough is None


def test_magrpo_hands_the_option_to_the_env(tmp_path):
    built = []

    def factory(**kw):
        built.append(dict(kw))
        kw.pop("external_prompt_passthrough", None)
        return CountingEnv(**kw)

    team = FakeTeam([BigramPolicy(init_seed=1), BigramPolicy(init_seed=2)])
    common = dict(num_turns=2, output_dir=str(tmp_path / "run"), progress_bar=False)
    MAGRPOTrainer(MAGRPOConfig(external_prompt_passthrough=True, **common), team, factory)
    assert built[-1]["external_prompt_passthrough"] is True
    MAGRPOTrainer(MAGRPOConfig(**common), team, factory)
    assert "external_prompt_passthrough" not in built[-1]  # unset: the env's own default
