"""Layout measurements kept on disk, so that every process on one machine decides alike.

:mod:`comlrl_core.models.cpu.fp32_layout` picks a weight layout (and whether MKL's packed
copy of the large weights pays) by timing both on the model's own weights. Timings move
with the machine's load, and the layouts sum products in different orders, so they do not
sample exactly the same tokens (on an AMD EPYC, 1 row in 16 differed over 96 tokens). Two
runs of one seeded job could then decide a row class near the threshold differently and
drift apart. So the processes that measure a case write the measurement here, and later
processes read it instead of timing again: a seeded run repeats on the same machine, and
skips the measurement (a few hundred ms per row-count class). The first few processes
(``fp32_layout.RECORD_MEASUREMENTS``) each time the case again and merge their timings into
the record, so that one measurement taken on a busy machine cannot decide for good (on an
AMD EPYC, a first process timed 16 rows at 29.2 ms plain and 28.5 ms packed, a pass that
later processes timed at 18-21 and 15-18 ms).

A case is keyed by what the timing depends on: the kind of decision, the weight shapes,
the row-count class, the thread count, the CPU model and the torch version. Anything the
key does not capture (another machine of the same CPU model with different memory, a
changed BIOS setting) keeps the old measurement: delete the file to measure afresh.

Where: ``$COMLRL_FP32_LAYOUT_RECORD``, else ``fp32_layout.json`` in the cache folder
(``$COMLRL_CACHE``, else ``~/.cache/comlrl``). ``COMLRL_FP32_LAYOUT_RECORD=off`` measures in
every process and writes nothing. An unreadable file is measured over (one WARNING) and an
unwritable folder only costs the next process its own measurement (one WARNING).

Public API::

    record_path() -> str | None            (None: switched off)
    case_key(kind, shapes, rows, threads) -> str
    recorded(key) -> dict | None           (the fields written for that case)
    record(key, fields) -> None
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any

import torch

from comlrl_core.models.precision import cpu_model_name

logger = logging.getLogger(__name__)

ENV_VAR = "COMLRL_FP32_LAYOUT_RECORD"
FILE_NAME = "fp32_layout.json"
_OFF = ("off", "0", "false", "no", "none")
_FORMAT = 2  # bumped when the fields change: older files are then measured over (2: merged measurements)
_warned: set[tuple[str, str]] = set()  # (file, what went wrong): one WARNING each


def record_path() -> str | None:
    """The record file, or None when the environment switches the record off."""
    value = os.environ.get(ENV_VAR, "").strip()
    if value.lower() in _OFF:
        return None
    if value:
        return os.path.expanduser(value)
    root = os.environ.get("COMLRL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "comlrl")
    return os.path.join(root, FILE_NAME)


def case_key(kind: str, shapes: Any, rows: int, threads: int) -> str:
    """One measured case: the decision's kind, the weight shapes, the row-count class, the
    thread count, and the machine and library the timing depends on."""
    return json.dumps([kind, shapes, rows, threads, cpu_model_name(), torch.__version__])


def _warn_once(path: str, what: str, message: str) -> None:
    if (path, what) not in _warned:
        _warned.add((path, what))
        logger.warning(message)


def _read(path: str) -> dict[str, dict[str, Any]]:
    """The cases of the file (empty when there is none; a WARNING when it is unreadable)."""
    try:
        with open(path, encoding="utf-8") as handle:
            content = json.load(handle)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except (OSError, ValueError) as exc:
        _warn_once(path, "read", f"fp32 layout record {path} unreadable ({exc}); measuring again and rewriting it")
        return {}
    if not isinstance(content, dict) or content.get("format") != _FORMAT or not isinstance(content.get("cases"), dict):
        return {}  # another format: measured over, and replaced at the next write
    return content["cases"]


def recorded(key: str) -> dict[str, Any] | None:
    """The fields an earlier process recorded for ``key``, or None (none, or switched off)."""
    path = record_path()
    if path is None:
        return None
    fields = _read(path).get(key)
    return fields if isinstance(fields, dict) else None


def record(key: str, fields: dict[str, Any]) -> None:
    """Add ``key``'s measurement to the file (atomically: a reader sees the old file or the
    new one, never half of one)."""
    path = record_path()
    if path is None:
        return
    cases = _read(path)
    cases[key] = fields
    folder = os.path.dirname(path) or "."
    try:
        os.makedirs(folder, exist_ok=True)
        handle, staging = tempfile.mkstemp(prefix=".fp32_layout.", dir=folder)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump({"format": _FORMAT, "cases": cases}, out, indent=1, sort_keys=True)
            os.chmod(staging, 0o644)  # mkstemp makes it private; a shared cache folder is read by all
            os.replace(staging, path)
        except BaseException:
            os.unlink(staging)
            raise
    except OSError as exc:
        _warn_once(
            path, "write", f"fp32 layout record {path} not written ({exc}); other processes will measure for themselves"
        )
        return
    logger.info("fp32 layout measurement recorded in %s", path)
