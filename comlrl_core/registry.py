"""Environment registry, built on PettingZoo's own parallel registry.

Environments register themselves by id (``comlrl/CoopCode-v0``); learners make them by id
and never import an environment package. Built-in and third-party environment packages
are found through the ``comlrl.envs`` entry-point group, each entry naming a zero-argument
function that performs its ``register`` calls. Loading is lazy: it happens the first time
``make`` or ``registered_ids`` needs it.
"""

from __future__ import annotations

import importlib.metadata
from typing import TYPE_CHECKING, Any, Callable

from pettingzoo.env_registry import registration as _pz
from pettingzoo.env_registry.exceptions import PettingZooRegistryError

if TYPE_CHECKING:
    from pettingzoo import ParallelEnv  # untyped library: the checker reads it as Any

_ENTRY_POINT_GROUP = "comlrl.envs"
_plugins_loaded = False


def register(id: str, entry_point: Callable[..., Any] | str, **defaults: Any) -> None:
    """Register a parallel environment under ``id`` with default constructor kwargs."""
    if not isinstance(id, str) or "/" not in id:
        raise ValueError(f"environment id must look like 'namespace/Name-vN', got {id!r}")
    _pz.register("parallel", id, entry_point=entry_point, kwargs=dict(defaults))


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in importlib.metadata.entry_points(group=_ENTRY_POINT_GROUP):
        ep.load()()


def registered_ids(namespace: str | None = "comlrl") -> list[str]:
    """Registered parallel-env ids, optionally restricted to one namespace."""
    _load_plugins()
    ids = sorted(_pz.parallel_registry)
    if namespace is None:
        return ids
    return [i for i in ids if i.startswith(namespace + "/")]


def make(id: str, **overrides: Any) -> ParallelEnv:
    """Build the environment registered as ``id``; ``overrides`` replace its defaults."""
    _load_plugins()
    try:
        spec = _pz.spec("parallel", id)
    except PettingZooRegistryError as err:
        known = ", ".join(registered_ids(None if "/" not in id else id.split("/")[0])) or "none"
        raise KeyError(f"unknown environment id {id!r}; registered: {known}") from err
    return _pz.make("parallel", spec, **overrides)
