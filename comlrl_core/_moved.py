"""Old flat module paths (``comlrl_core.hf_policy``, ...) kept importable for one release.

The modules moved into subpackages (``models/``, ``run/``, ``remote/``, ``config/``,
``episodes/``). Importing an old path gives a thin proxy of the new module and a
``DeprecationWarning`` that names the new path. Removed in 0.3.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from typing import Any

MOVED_MODULES: dict[str, str] = {
    "comlrl_core.agent_spec": "comlrl_core.models.agent_spec",
    "comlrl_core.checkpoint": "comlrl_core.run.checkpoint",
    "comlrl_core.config_types": "comlrl_core.config.coercion",
    "comlrl_core.evaluation": "comlrl_core.episodes.evaluation",
    "comlrl_core.gqa_attention": "comlrl_core.models.cpu.gqa_attention",
    "comlrl_core.heap": "comlrl_core.models.cpu.heap",
    "comlrl_core.hf_policy": "comlrl_core.models.hf_policy",
    "comlrl_core.lora": "comlrl_core.models.lora",
    "comlrl_core.metrics": "comlrl_core.run.metrics",
    "comlrl_core.model_source": "comlrl_core.models.model_source",
    "comlrl_core.packed_linear": "comlrl_core.models.cpu.packed_linear",
    "comlrl_core.progress": "comlrl_core.run.progress",
    "comlrl_core.remote_formats": "comlrl_core.remote.formats",
    "comlrl_core.remote_types": "comlrl_core.remote.types",
    "comlrl_core.rng": "comlrl_core.run.rng",
    "comlrl_core.sampling": "comlrl_core.models.sampling",
    "comlrl_core.simple_policies": "comlrl_core.models.simple_policies",
    "comlrl_core.team": "comlrl_core.models.team",
    "comlrl_core.tiny": "comlrl_core.models.tiny",
    "comlrl_core.tokens": "comlrl_core.models.tokens",
}


def _warn(old: str, new: str) -> None:
    warnings.warn(
        f"{old} moved to {new}; the old path goes away in comlrl-gym 0.3, import {new} instead",
        DeprecationWarning,
        stacklevel=3,
    )


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers imports of the old paths with a proxy that forwards every attribute."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return types.ModuleType(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        new = MOVED_MODULES[module.__name__]
        _warn(module.__name__, new)
        target = importlib.import_module(new)

        def forward(name: str) -> Any:
            return getattr(target, name)

        vars(module)["__getattr__"] = forward  # PEP 562: the module's missing names come from the target
        module.__doc__ = target.__doc__
        if hasattr(target, "__all__"):
            vars(module)["__all__"] = list(target.__all__)


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
