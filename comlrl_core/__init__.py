"""comlrl_core: the contracts shared by environments and learners, and the machinery behind them.

At the top level only the contracts: :mod:`~comlrl_core.policy` (Policy, Completion,
GenerationConfig), :mod:`~comlrl_core.env_api` (how environments are stepped and read),
:mod:`~comlrl_core.registry` (env ids) and :mod:`~comlrl_core.cli` (the plugin command
line). The machinery lives in subpackages: ``models/`` (TransformersPolicy, sampling,
LoRA, model sources, Team), ``remote/`` (remote-model client), ``config/`` (typed
configs), ``run/`` (checkpoints, metrics, progress, RNG) and ``episodes/`` (evaluation).
``docs/design.md`` gives the import rules.

Light names are imported eagerly; the torch-heavy ones (``TransformersPolicy``, ``Team``,
``AgentSpec``, ``tiny_model_path``) load on first access so that ``import comlrl_core``
stays cheap for environment-only users.
"""

from __future__ import annotations

import importlib
from typing import Any

from comlrl_core import _moved
from comlrl_core.config import BaseConfig, ConfigError, option
from comlrl_core.models.simple_policies import CallablePolicy, RemotePolicy
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
from comlrl_core.run.metrics import MetricsLogger

_moved.install()

_LAZY = {
    "TransformersPolicy": "comlrl_core.models.hf_policy",
    "Team": "comlrl_core.models.team",
    "AgentSpec": "comlrl_core.models.agent_spec",
    "tiny_model_path": "comlrl_core.models.tiny",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'comlrl_core' has no attribute {name!r}")


__all__ = [
    "AgentSpec",
    "BaseConfig",
    "CallablePolicy",
    "Completion",
    "ConfigError",
    "GenerationConfig",
    "MetricsLogger",
    "Policy",
    "RemoteAuthError",
    "RemoteModelClient",
    "RemoteModelConfig",
    "RemoteModelError",
    "RemotePolicy",
    "RemoteRequestError",
    "RemoteResponseError",
    "RemoteUnavailableError",
    "Team",
    "TransformersPolicy",
    "option",
    "tiny_model_path",
]
__version__ = "0.1.0"
