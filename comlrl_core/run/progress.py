"""Progress bars for long loops (a thin, consistent wrapper around tqdm).

Bars go to stderr, so stdout stays clean for results. By default a bar shows only
when stderr is a terminal (logs of batch jobs are not flooded with carriage
returns); ``disable=False`` forces it on, ``disable=True`` off, and the environment
variable ``COMLRL_PROGRESS`` (``1``/``0``) overrides the automatic choice.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterable, Mapping, TextIO, TypeVar

from tqdm import tqdm

__all__ = ["progress", "set_postfix"]

T = TypeVar("T")


def _auto_disable(stream: TextIO) -> bool:
    forced = os.environ.get("COMLRL_PROGRESS", "").strip().lower()
    if forced in ("1", "true", "yes", "on"):
        return False
    if forced in ("0", "false", "no", "off"):
        return True
    isatty = getattr(stream, "isatty", None)
    return not (callable(isatty) and isatty())


def progress(
    iterable: Iterable[T] | None = None,
    total: int | None = None,
    desc: str | None = None,
    disable: bool | None = None,
    *,
    file: TextIO | None = None,
    leave: bool = True,
    unit: str = "it",
    **tqdm_kwargs: Any,
) -> "tqdm[T]":
    """A tqdm bar over ``iterable`` (or a manual one with ``total`` and ``.update()``).

    ``disable=None`` decides automatically (see the module docstring).
    """
    stream = file if file is not None else sys.stderr
    if disable is None:
        disable = _auto_disable(stream)
    return tqdm(
        iterable,
        total=total,
        desc=desc,
        disable=disable,
        file=stream,
        leave=leave,
        unit=unit,
        dynamic_ncols=True,
        **tqdm_kwargs,
    )


def set_postfix(bar: "tqdm", metrics: Mapping[str, Any], digits: int = 4) -> None:
    """Show ``metrics`` after the bar, numbers rounded to ``digits`` significant digits."""
    shown = {}
    for key, value in metrics.items():
        if hasattr(value, "item") and callable(value.item):
            value = value.item()
        shown[key] = f"{value:.{digits}g}" if isinstance(value, float) else value
    bar.set_postfix(shown, refresh=False)
