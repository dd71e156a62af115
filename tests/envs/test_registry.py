"""envs.register / envs.make on PettingZoo's parallel registry."""

from __future__ import annotations

import warnings

import pytest
from pettingzoo.env_registry import registration

import envs
from comlrl_core import registry
from envs.writing import WritingEnv


def test_builtin_ids_are_registered_with_string_entry_points():
    ids = envs.registered_ids("comlrl")
    assert {"comlrl/CoopCode-v0", "comlrl/Writing-v0"} <= set(ids)
    assert registration.spec("parallel", "comlrl/CoopCode-v0").entry_point == "envs.code:CoopCodeEnv"
    assert registration.spec("parallel", "comlrl/Writing-v0").entry_point == "envs.writing:WritingEnv"


def test_register_builtin_envs_is_idempotent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pettingzoo warns when an id is overridden
        envs.register_builtin_envs()
        envs.register_builtin_envs()


def test_make_applies_overrides():
    env = envs.make("comlrl/Writing-v0", num_turns=2, expansion_ratio=2.0, task_slice="0:10")
    assert isinstance(env, WritingEnv)
    assert env.num_turns == 2 and env.reward_config.expansion_ratio == 2.0 and env.num_tasks == 10
    assert envs.make is registry.make and envs.register is registry.register


def test_register_custom_env_with_defaults(toy_cls):
    envs.register("tests/Toy-v0", toy_cls, num_tasks=3, num_turns=2)
    env = envs.make("tests/Toy-v0")
    assert isinstance(env, toy_cls) and env.num_tasks == 3 and env.num_turns == 2
    assert envs.make("tests/Toy-v0", num_turns=4).num_turns == 4
    assert "tests/Toy-v0" in envs.registered_ids("tests")
    assert "tests/Toy-v0" not in envs.registered_ids("comlrl")


def test_unknown_id_and_bad_id_are_clear_errors():
    with pytest.raises(KeyError, match="unknown environment id 'comlrl/Nope-v0'.*comlrl/Writing-v0"):
        envs.make("comlrl/Nope-v0")
    with pytest.raises(ValueError, match="namespace/Name-vN"):
        envs.register("NoNamespace", WritingEnv)
