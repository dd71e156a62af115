"""comlrl environments: PettingZoo ParallelEnv text tasks for teams of LLM agents.

``envs.make(id, **overrides)`` builds a registered environment; ``envs.register`` adds
one. Built-in ids:

* ``comlrl/CoopCode-v0`` -- cooperative code generation (``envs.code``).
* ``comlrl/Writing-v0`` -- complementary summary + expansion writing with cheap,
  deterministic text-statistics rewards (``envs.writing``).
* ``comlrl/Dataset-v0`` -- any dataset (list of dicts, ``datasets.Dataset``, JSON file) with
  per-agent formatters and a CoMLRL-style ``reward_func`` (``envs.dataset``).
"""

from __future__ import annotations

from comlrl_core.registry import make, register, registered_ids
from envs.base import TextParallelEnv

# Binding the function after the submodule import makes ``envs.evaluate`` the function
# (the package attribute would otherwise be the module ``envs.evaluate``).
from envs.evaluate import evaluate  # noqa: E402
from envs.reward_processing import RewardProcessor

__all__ = [
    "RewardProcessor",
    "TextParallelEnv",
    "evaluate",
    "make",
    "register",
    "register_builtin_envs",
    "registered_ids",
]

BUILTIN_ENVS: dict[str, str] = {
    "comlrl/CoopCode-v0": "envs.code:CoopCodeEnv",
    "comlrl/Writing-v0": "envs.writing:WritingEnv",
    "comlrl/Dataset-v0": "envs.dataset:DatasetEnv",
}
_builtin_registered = False


def register_builtin_envs() -> None:
    """Register the built-in ids (entry points as strings: nothing heavy is imported)."""
    global _builtin_registered
    if _builtin_registered:
        return
    _builtin_registered = True
    for env_id, entry_point in BUILTIN_ENVS.items():
        register(env_id, entry_point)
