"""Resuming safely: which checkpoint to resume, and tidying what a killed save left.

:func:`find_resume_checkpoint` verifies the newest checkpoint (hashes) and stops when it
is damaged, instead of quietly resuming an older one (``skip_corrupt`` falls back and
lists what it skipped). :func:`recover_leftovers` deletes ``*.tmp-*`` folders and puts an
intact ``*.old-*`` copy back, touching no numbered checkpoint. The lower-level
:func:`comlrl_core.run.checkpoint.latest_checkpoint` / ``cleanup_incomplete`` keep their
skip-and-delete behaviour for callers that want it.
"""

from __future__ import annotations

import os
import pathlib
import shutil

from comlrl_core.run.checkpoint import (
    _OLD_MARK,
    _TMP_MARK,
    CHECKPOINT_PREFIX,
    CheckpointError,
    NoCheckpointError,
    _fsync_dir,
    _numbered,
    _verify_contents,
    verify_checkpoint,
)

__all__ = ["find_resume_checkpoint", "recover_leftovers"]


def _describe_failure(err: CheckpointError) -> str:
    return "incomplete" if err.incomplete else "corrupt"


def find_resume_checkpoint(
    root: str | os.PathLike, *, prefix: str = CHECKPOINT_PREFIX, skip_corrupt: bool = False
) -> tuple[pathlib.Path, list[tuple[pathlib.Path, str]]]:
    """The newest checkpoint under ``root`` to resume from, verified with hashes.

    Returns ``(path, skipped)``: ``skipped`` lists ``(checkpoint, reason)`` for newer
    checkpoints passed over (only with ``skip_corrupt``). Raises :class:`CheckpointError`
    naming the newest checkpoint when it is damaged and ``skip_corrupt`` is off, naming
    every checkpoint when all are damaged, and saying so when there is none.
    """
    root = pathlib.Path(root)
    numbered = _numbered(root, prefix)
    if not numbered:
        raise NoCheckpointError(f"no checkpoint to resume under {root}")
    skipped: list[tuple[pathlib.Path, str]] = []
    for _, path in reversed(numbered):
        try:
            verify_checkpoint(path, verify_hashes=True)
        except CheckpointError as err:
            if not skip_corrupt:
                detail = str(err).removeprefix(f"{path}: ")
                raise CheckpointError(
                    f"the newest checkpoint {path} is {_describe_failure(err)}: {detail}", incomplete=err.incomplete
                ) from None
            skipped.append((path, str(err)))
            continue
        return path, skipped
    names = ", ".join(p.name for p, _ in skipped)
    raise CheckpointError(f"every checkpoint under {root} is damaged ({names}); none can be resumed")


def recover_leftovers(root: str | os.PathLike, *, prefix: str = CHECKPOINT_PREFIX) -> dict[str, list[pathlib.Path]]:
    """Tidy what a killed save left under ``root``; numbered checkpoints are never touched.

    ``*.tmp-*`` folders (a save that never finished) are deleted. An intact ``*.old-*``
    copy (a save died between moving the previous checkpoint aside and installing the new
    one) is renamed back when its name is free; when the checkpoint of that name is in
    place and intact the copy is deleted; a damaged copy whose name is free is deleted;
    anything else is left for a person to look at. Returns
    ``{"removed": [...], "restored": [...], "kept": [...]}``.
    """
    root = pathlib.Path(root)
    report: dict[str, list[pathlib.Path]] = {"removed": [], "restored": [], "kept": []}
    if not root.is_dir():
        return report
    for entry in sorted(root.iterdir()):
        if not entry.is_dir() or not entry.name.startswith(prefix):
            continue
        if _TMP_MARK in entry.name:
            shutil.rmtree(entry)
            report["removed"].append(entry)
        elif _OLD_MARK in entry.name:
            original = entry.with_name(entry.name.split(_OLD_MARK, 1)[0])
            intact = _is_intact(entry)
            if intact and not original.exists():
                os.replace(entry, original)
                _fsync_dir(root)
                report["restored"].append(original)
            elif not original.exists() or _is_intact(original):
                shutil.rmtree(entry)
                report["removed"].append(entry)
            else:  # both copies exist and the installed one is damaged: keep both
                report["kept"].append(entry)
    return report


def _is_intact(path: pathlib.Path) -> bool:
    try:
        _verify_contents(path, verify_hashes=True)
    except CheckpointError:
        return False
    return True
