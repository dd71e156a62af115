"""PettingZoo conformance of every registered comlrl environment, with random-string actions.

``parallel_api_test`` and ``parallel_seed_test`` sample actions from the Text action
spaces, i.e. random printable strings (newlines included): the environments must take
them, score them low and stay deterministic under a seed.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from pettingzoo.test import parallel_api_test, parallel_seed_test

import envs


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


def _kwargs_for(env_id: str) -> list[dict[str, Any]]:
    """Constructor variants to check per id (every registered id must appear here)."""
    if env_id == "comlrl/Writing-v0":
        return [{}, {"num_turns": 3}, {"num_turns": 2, "external_transition": "level_feedback"}]
    if env_id == "comlrl/CoopCode-v0":
        backend = "docker" if _docker_answers() else "process"
        return [{"sandbox_backend": backend, "task_slice": "0:4", "num_turns": 2}]
    if env_id == "comlrl/Dataset-v0":
        rows = [{"prompt": f"Say the word number {i}."} for i in range(5)]
        base = {"dataset": rows, "reward_func": _length_reward}
        return [base, {**base, "num_turns": 3, "num_agents": 3, "batched_reward": True}]
    return [{}]


def _length_reward(*completions, batch_items=None):
    """Dataset-v0's reward in the conformance checks: deterministic in the completions."""
    return [sum(len(c) for c in joint) / 1000.0 for joint in zip(*completions, strict=True)]


CASES = [(env_id, kw) for env_id in envs.registered_ids("comlrl") for kw in _kwargs_for(env_id)]


def test_builtin_ids_are_all_checked():
    assert {"comlrl/CoopCode-v0", "comlrl/Writing-v0"} <= {env_id for env_id, _ in CASES}


def _make(env_id: str, kwargs: dict[str, Any]):
    if env_id == "comlrl/CoopCode-v0":
        import sandbox

        if not hasattr(sandbox, "Sandbox"):
            pytest.skip("sandbox.Sandbox is not implemented yet")
    return envs.make(env_id, **kwargs)


@pytest.mark.parametrize("env_id, kwargs", CASES, ids=[f"{i}-{k}" for i, k in CASES])
def test_parallel_api(env_id, kwargs):
    env = _make(env_id, kwargs)
    try:
        parallel_api_test(env, num_cycles=10)
    finally:
        env.close()


@pytest.mark.parametrize("env_id, kwargs", CASES, ids=[f"{i}-{k}" for i, k in CASES])
def test_parallel_seed(env_id, kwargs):
    _make(env_id, kwargs).close()  # skips early when the env cannot be built here
    parallel_seed_test(functools.partial(envs.make, env_id, **kwargs), num_cycles=10)
