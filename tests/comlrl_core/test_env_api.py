"""The env contract's readers: team reward, episode end, pass verdict."""

from __future__ import annotations

import pytest

from comlrl_core.env_api import episode_over, episode_terminated, step_passed, team_reward


class _Env:
    def __init__(self, agents=("a", "b"), threshold=None):
        self.agents = list(agents)
        if threshold is not None:
            self.success_threshold = threshold


class _Declares(_Env):
    def team_reward(self, rewards):
        return max(rewards.values())


def test_team_reward_is_the_mean_unless_the_env_declares_its_rule():
    assert team_reward(_Env(), {"a": 1.0, "b": 0.0}) == 0.5
    assert team_reward(_Env(), {"a": 0.1, "b": 0.1, "c": 0.1}) == 0.1  # equal rewards come back unrounded
    assert team_reward(_Declares(), {"a": 1.0, "b": 0.0}) == 1.0


def test_team_reward_refuses_an_empty_or_non_finite_step():
    with pytest.raises(ValueError, match="no rewards"):
        team_reward(_Env(), {})
    with pytest.raises(ValueError, match="finite"):
        team_reward(_Env(), {"a": float("nan")})


def test_episode_over_reads_terminations_truncations_and_live_agents():
    env = _Env()
    assert not episode_over(env, {"a": False, "b": False}, {"a": False, "b": False})
    assert episode_over(env, {"a": False, "b": True}, {"a": False, "b": False})
    assert episode_over(env, {"a": False}, {"a": True})
    env.agents = []
    assert episode_over(env, {}, {})
    assert episode_terminated({"a": True}) and not episode_terminated({"a": False})


def test_step_passed_prefers_the_passed_info_then_the_threshold():
    assert step_passed(_Env(threshold=2.0), {"a": {"passed": True, "raw_reward": 0.0}}) is True
    assert step_passed(_Env(threshold=2.0), {"a": {"raw_reward": 2.0}}) is True
    assert step_passed(_Env(threshold=2.0), {"a": {"raw_reward": 1.9}}) is False
    assert step_passed(_Env(), {"a": {"raw_reward": 5.0}}) is None  # no notion of success


def test_no_module_reads_the_team_reward_or_the_episode_end_its_own_way():
    """Readers call team_reward / episode_over; a step's reward or done dicts are read
    nowhere else (the patterns the issue found: ``next(iter(rew.values()))``,
    ``rew[agents[0]]``, ``any(terms.values())``)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    own_way = re.compile(
        r"\b(rew|rews|rewards|terms|truncs|terminations|truncations)\.values\(\)"
        r"|\b(rew|rewards)\[\w*agents?\[0\]\]|\b(rew|rewards)\[first\]"
    )
    offenders = []
    for package in ("learners", "envs", "comlrl_core", "bench", "sandbox"):
        for path in sorted((root / package).rglob("*.py")):
            if path.name == "env_api.py" and path.parent.name == "comlrl_core":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if own_way.search(line):
                    offenders.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert not offenders, "read the step through comlrl_core.env_api instead:\n" + "\n".join(offenders)
