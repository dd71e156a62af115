"""What learners and evaluators may rely on beyond the plain PettingZoo ParallelEnv API.

Learners reach environments only through the registry and these duck-typed calls, so
they never import an environment package:

* ``env.clone()`` -- an independent copy at the same state (histories included).
* ``env.state()`` -- a text view of the joint state.
* ``env.num_tasks`` -- how many task items the env's split holds; ``reset(options={"task": i})``
  selects item ``i``.
* ``type(env).step_many(envs, actions_list)`` (optional) -- steps many envs at once so that
  expensive scoring (e.g. a sandbox) is batched. ``step_many`` below falls back to a loop.
* ``env.success_threshold`` (optional) -- the raw reward at or above which an episode
  counts as solved when the env reports no ``passed`` info (pass@k).

How a step is read (every reader uses these two functions, never its own rule):

* :func:`team_reward` -- the team's reward of one step. An env may declare its own rule
  as a method ``team_reward(rewards) -> float``; otherwise it is the MEAN of the agents'
  rewards (cooperative envs give every agent the same reward, so it is that value).
* :func:`episode_over` -- the episode has ended when any agent is terminated or
  truncated, or when the env has no live agents left (``env.agents == []``).

Info keys (``infos[agent]`` after a step) that readers use:

* ``raw_reward`` -- the reward before the env's reward processing (pass@k thresholds
  compare against it);
* ``passed`` (optional, bool) -- whether the joint answer passed the task's tests; when
  present it decides pass@k instead of ``success_threshold``.

Constructor arguments every registered environment accepts (``make(id, **kwargs)``):
``num_turns`` (turns per episode), ``early_termination_threshold`` (end an episode once
the processed team reward reaches it), ``task_slice`` (the split, e.g. ``"0:100"`` or
``"-20:"``), ``external_transition`` (how the next turn's prompts are built),
``external_prompt_passthrough``, ``reward_processor``, ``formatters`` and ``render_mode``
(see ``envs.base.TextParallelEnv``).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

StepResult = tuple[dict[str, Any], dict[str, float], dict[str, bool], dict[str, bool], dict[str, Any]]

__all__ = ["StepResult", "episode_over", "episode_terminated", "step_many", "step_passed", "team_reward"]


def step_many(envs: Sequence[Any], actions_list: Sequence[dict[str, str]]) -> list[StepResult]:
    """Step each env with its joint action; batched when the env class supports it."""
    if len(envs) != len(actions_list):
        raise ValueError(f"step_many got {len(envs)} envs but {len(actions_list)} joint actions")
    if not envs:
        return []
    batched = getattr(type(envs[0]), "step_many", None)
    if batched is not None and all(type(e) is type(envs[0]) for e in envs):
        return list(batched(list(envs), list(actions_list)))
    return [env.step(actions) for env, actions in zip(envs, actions_list, strict=True)]


def team_reward(env: Any, rewards: Mapping[str, Any]) -> float:
    """The team's reward of one step: ``env.team_reward(rewards)`` when the env declares
    it, else the mean of the agents' rewards.

    Raises ValueError when the step gave no reward at all (an env must reward every agent
    it stepped) or the result is not a finite number.
    """
    if not rewards:
        raise ValueError(f"{type(env).__name__}.step returned no rewards; an env must reward every agent it stepped")
    declared = getattr(env, "team_reward", None)
    if callable(declared):
        value = float(declared(dict(rewards)))
    else:
        values = [float(r) for r in rewards.values()]
        # equal rewards (the cooperative case) are returned as they are, without rounding
        value = values[0] if all(v == values[0] for v in values) else math.fsum(values) / len(values)
    if not math.isfinite(value):
        raise ValueError(f"{type(env).__name__}: the team reward of {dict(rewards)} is {value}, not a finite number")
    return value


def episode_over(env: Any, terminations: Mapping[str, bool], truncations: Mapping[str, bool]) -> bool:
    """Whether the step that returned ``terminations`` / ``truncations`` ended the episode."""
    if any(terminations.values()) or any(truncations.values()):
        return True
    agents = getattr(env, "agents", None)
    return agents is not None and len(agents) == 0


def episode_terminated(terminations: Mapping[str, bool]) -> bool:
    """Whether the episode ended early (an agent terminated) rather than by the turn limit."""
    return any(terminations.values())


def step_passed(env: Any, infos: Mapping[str, Any]) -> bool | None:
    """Whether a step's joint answer succeeded (pass@k reads the episode's last step).

    ``passed`` from the agents' infos when the env reports it; else ``raw_reward >=
    env.success_threshold`` when the env declares a threshold; else None (no verdict).
    """
    verdicts = [bool(i["passed"]) for i in infos.values() if isinstance(i, Mapping) and "passed" in i]
    if verdicts:
        return any(verdicts)
    threshold = getattr(env, "success_threshold", None)
    raws = [i["raw_reward"] for i in infos.values() if isinstance(i, Mapping) and i.get("raw_reward") is not None]
    if threshold is None or not raws:
        return None
    return float(raws[0]) >= float(threshold)
