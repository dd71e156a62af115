"""Load a bench/ script as a module for its tests (bench/ is not a package)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType
from typing import Iterator

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_bench_script(name: str) -> Iterator[ModuleType]:
    """Yield ``bench/<name>.py`` imported as ``bench_<name>``, unregistered afterwards
    (dataclasses look their module up by name in ``sys.modules`` while it runs)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
