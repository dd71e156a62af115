"""How learners get their environments and policies (registry + duck-typed Team)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence, TypeVar

import torch

from comlrl_core.models.cpu.heap import retained_heap
from comlrl_core.models.cpu.memory_stats import released_between_phases
from comlrl_core.policy import Policy
from comlrl_core.registry import make


def build_env(env: str | Callable[..., Any], **kwargs: Any) -> Any:
    """An environment from a registered id (``comlrl_core.registry.make``) or a factory.

    ``kwargs`` (None values dropped) are constructor overrides, e.g. ``num_turns``.
    """
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    if isinstance(env, str):
        return make(env, **kwargs)
    if callable(env):
        return env(**kwargs)
    raise TypeError(f"env must be a registered id (str) or a factory callable, got {type(env).__name__}")


def team_policies(team: Any) -> list[Policy]:
    """The team's policies in agent order (a Team, or any sequence of policies)."""
    policies = getattr(team, "policies", None)
    if policies is None:
        policies = list(team)
    policies = list(policies)
    if not policies or not all(isinstance(p, Policy) for p in policies):
        raise TypeError("team must hold comlrl_core.policy.Policy objects, one per agent")
    return policies


def check_team_fits_env(policies: Sequence[Policy], env: Any) -> list[str]:
    """The env's agent names, after checking there is one policy per agent."""
    agents = list(env.possible_agents)
    if len(agents) != len(policies):
        raise ValueError(
            f"the environment has {len(agents)} agents {agents} but the team has "
            f"{len(policies)} policies; give one model per agent"
        )
    return agents


def num_tasks(env: Any) -> int:
    count = getattr(env, "num_tasks", None)
    if not isinstance(count, int) or count < 1:
        raise ValueError("the environment must expose num_tasks >= 1 (see comlrl_core.env_api)")
    return count


def tune_host_memory(config: Any, policies: Sequence[Policy]) -> bool:
    """Whether ``train()`` keeps freed memory in the process heap while it runs
    (``config.retain_freed_memory`` and a policy on the CPU; see
    :mod:`comlrl_core.models.cpu.heap`). Trainers store it as ``retain_heap``."""
    return bool(getattr(config, "retain_freed_memory", False)) and _any_on_cpu(policies)


def releases_between_phases(config: Any, policies: Sequence[Policy]) -> str:
    """How often ``train()`` hands the allocator's free memory back: ``config.release_freed_memory``
    when a policy is on the CPU, else ``"never"`` (see :mod:`comlrl_core.models.cpu.memory_stats`).
    Trainers store it as ``release_memory``."""
    level = getattr(config, "release_freed_memory", "never")
    return level if level != "never" and _any_on_cpu(policies) else "never"


def _any_on_cpu(policies: Sequence[Policy]) -> bool:
    return any(torch.device(p.device).type == "cpu" for p in policies)  # device: str or torch.device


Train = TypeVar("Train", bound=Callable[..., Any])


def host_memory_managed(train: Train) -> Train:
    """Decorator for a trainer's ``train``: for the call's duration the heap keeps freed
    memory when the trainer's ``retain_heap`` says so (handed back afterwards), and the
    allocator's free memory is released between phases when its ``release_memory`` does."""

    @functools.wraps(train)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with (
            retained_heap(bool(getattr(self, "retain_heap", False))),
            released_between_phases(getattr(self, "release_memory", "never")),
        ):
            return train(self, *args, **kwargs)

    return run  # type: ignore[return-value]
