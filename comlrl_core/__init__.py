"""comlrl_core: the contracts shared by environments and learners, and shared machinery."""

from comlrl_core.policy import Completion, GenerationConfig, Policy

__all__ = ["Completion", "GenerationConfig", "Policy"]
__version__ = "0.1.0"
