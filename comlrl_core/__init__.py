"""comlrl_core: the contracts shared by environments and learners, and shared machinery.

Light names are imported eagerly; the torch-heavy ones (``TransformersPolicy``, ``Team``,
``AgentSpec``, ``tiny_model_path``) load on first access so that ``import comlrl_core``
stays cheap for environment-only users.
"""

from __future__ import annotations

import importlib
from typing import Any

from comlrl_core.config import BaseConfig, ConfigError, option
from comlrl_core.metrics import MetricsLogger
from comlrl_core.policy import Completion, GenerationConfig, Policy
from comlrl_core.remote import (
    RemoteAuthError,
    RemoteModelClient,
    RemoteModelConfig,
    RemoteModelError,
    RemoteRequestError,
    RemoteResponseError,
    RemoteUnavailableError,
)
from comlrl_core.simple_policies import CallablePolicy, RemotePolicy

_LAZY = {
    "TransformersPolicy": "comlrl_core.hf_policy",
    "Team": "comlrl_core.team",
    "AgentSpec": "comlrl_core.agent_spec",
    "tiny_model_path": "comlrl_core.tiny",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'comlrl_core' has no attribute {name!r}")


__all__ = [
    "AgentSpec", "BaseConfig", "CallablePolicy", "Completion", "ConfigError", "GenerationConfig",
    "MetricsLogger", "Policy", "RemoteAuthError", "RemoteModelClient", "RemoteModelConfig",
    "RemoteModelError", "RemotePolicy", "RemoteRequestError", "RemoteResponseError",
    "RemoteUnavailableError", "Team", "TransformersPolicy", "option", "tiny_model_path",
]
__version__ = "0.1.0"
