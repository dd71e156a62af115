"""What learners may rely on beyond the plain PettingZoo ParallelEnv API.

Learners reach environments only through the registry and these duck-typed calls, so
they never import an environment package:

* ``env.clone()`` -- an independent copy at the same state (histories included).
* ``env.state()`` -- a text view of the joint state.
* ``env.num_tasks`` -- how many task items the env's split holds; ``reset(options={"task": i})``
  selects item ``i``.
* ``type(env).step_many(envs, actions_list)`` (optional) -- steps many envs at once so that
  expensive scoring (e.g. a sandbox) is batched. ``step_many`` below falls back to a loop.
"""

from __future__ import annotations

from typing import Any, Sequence

StepResult = tuple[dict[str, Any], dict[str, float], dict[str, bool], dict[str, bool], dict[str, Any]]


def step_many(envs: Sequence[Any], actions_list: Sequence[dict[str, str]]) -> list[StepResult]:
    """Step each env with its joint action; batched when the env class supports it."""
    if len(envs) != len(actions_list):
        raise ValueError(f"step_many got {len(envs)} envs but {len(actions_list)} joint actions")
    if not envs:
        return []
    batched = getattr(type(envs[0]), "step_many", None)
    if batched is not None and all(type(e) is type(envs[0]) for e in envs):
        return list(batched(list(envs), list(actions_list)))
    return [env.step(actions) for env, actions in zip(envs, actions_list)]
