"""Cooperative code generation: ``comlrl/CoopCode-v0`` (aux + main agents, or one agent).

See :mod:`envs.code.env` for the environment's full description.
"""

from envs.code.env import CodeSandboxError, CoopCodeEnv
from envs.code.reward import RewardWeights
from envs.code.tasks import load_tasks

__all__ = ["CodeSandboxError", "CoopCodeEnv", "RewardWeights", "load_tasks"]
