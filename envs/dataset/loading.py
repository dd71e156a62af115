"""Turning what a user hands to :class:`envs.dataset.DatasetEnv` into rows and callables.

* A dataset is a list (or any sized sequence) of mappings, a Hugging Face
  ``datasets.Dataset`` (duck-typed: ``len`` and iteration over row dicts; the package is
  never imported here), or the path of a ``.json`` file (a list of objects) or a
  ``.jsonl`` file (one object per line).
* A callable given as text ``"package.module:attribute"`` is imported, so that a YAML
  config (``env_kwargs``) can name the reward function and the formatters.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pathlib
from collections.abc import Mapping
from typing import Any, Callable


def resolve_callable(spec: Any, name: str) -> Callable[..., Any]:
    """``spec`` itself when callable; ``"module:attr"`` imported; anything else a TypeError."""
    if callable(spec):
        return spec
    if isinstance(spec, str):
        module_name, sep, attr = spec.partition(":")
        if not sep or not module_name or not attr:
            raise ValueError(f"{name} {spec!r} must be a callable or the text 'package.module:function'")
        try:
            target: Any = importlib.import_module(module_name)
        except ImportError as err:
            raise ValueError(f"{name} {spec!r}: cannot import module {module_name!r} ({err})") from None
        for part in attr.split("."):
            if not hasattr(target, part):
                raise ValueError(f"{name} {spec!r}: module {module_name!r} has no attribute {attr!r}")
            target = getattr(target, part)
        if not callable(target):
            raise TypeError(f"{name} {spec!r} names a {type(target).__name__}, not a callable")
        return target
    raise TypeError(f"{name} must be a callable or the text 'package.module:function', got {type(spec).__name__}")


def accepts_keyword(fn: Callable[..., Any], keyword: str) -> bool:
    """Whether ``fn`` can be called with ``keyword=...`` (named parameter or ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature: do not pass extras
        return False
    if keyword in params and params[keyword].kind is not inspect.Parameter.POSITIONAL_ONLY:
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _read_file(path: pathlib.Path) -> list[Any]:
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {str(path)!r} does not exist")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{number}: not a JSON line: {err}") from None
        return rows
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not JSON: {err}") from None
        if not isinstance(data, list):
            raise ValueError(f"{path} must hold a JSON list of objects, got a {type(data).__name__}")
        return data
    raise ValueError(f"dataset file {str(path)!r} must end in .json (a list of objects) or .jsonl (one per line)")


def check_dataset(dataset: Any) -> None:
    """Cheap checks at construction: a file path, or a sized, non-empty collection of rows."""
    if isinstance(dataset, (str, os.PathLike)):
        return
    if isinstance(dataset, Mapping):
        raise TypeError(
            "dataset must be a list of items (dicts), a datasets.Dataset or a .json/.jsonl path, got one "
            "mapping; a datasets.DatasetDict needs a split: dataset['train']"
        )
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__iter__"):
        raise TypeError(
            f"dataset must be a list of items (dicts), a datasets.Dataset or a .json/.jsonl path, got "
            f"{type(dataset).__name__}; a streaming (iterable) dataset must be materialised first, "
            "e.g. list(dataset.take(n))"
        )
    if len(dataset) == 0:
        raise ValueError("dataset is empty: give at least one item")


def load_rows(dataset: Any) -> list[dict[str, Any]]:
    """Every item of ``dataset`` as a plain dict (see the module docstring for the inputs)."""
    check_dataset(dataset)
    raw = _read_file(pathlib.Path(dataset)) if isinstance(dataset, (str, os.PathLike)) else dataset
    rows = []
    for index, row in enumerate(raw):
        if not isinstance(row, Mapping):
            raise TypeError(f"dataset item {index} is a {type(row).__name__}; every item must be a dict of fields")
        rows.append(dict(row))
    if not rows:
        raise ValueError("dataset is empty: give at least one item")
    return rows
