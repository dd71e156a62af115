"""Atomic, verified checkpoints: models/adapters, optimizers, RNG states and a cursor.

Layout of one checkpoint (``root/checkpoint-000120``)::

    policies/<name>/     whatever ``policy.save(dir)`` writes (weights, adapter, tokenizer)
    optimizers/<name>.pt ``optimizer.state_dict()`` (AdamW moments included)
    rng.pt               Python / NumPy / torch CPU+CUDA states and named generators
    cursor.json          where the trainer was (a JSON-able dict)
    extra/<name>         caller-supplied bytes
    manifest.json        size + sha256 of every file above, then ``"complete": true``

Why it cannot be half-written: everything is written into a sibling folder
``<name>.tmp-<random>``, every file and folder is fsynced, the manifest is written
last, and only then is the folder renamed to its final name (rename is atomic on one
filesystem). An older checkpoint of the same name is renamed aside first and deleted
only after the new one is in place. Loading checks the manifest (marker, sizes and
hashes) before touching any state, so a torn or tampered checkpoint raises
:class:`CheckpointError` instead of being used.

What is never lost: a save refuses optimizer state that holds NaN/Inf (the last good
checkpoint stays the newest one); a save over a checkpoint that fails its hashes moves
the damaged one aside as ``<name>.corrupt-<random>`` instead of deleting it; and
``comlrl_core.run.checkpoint_recovery.find_resume_checkpoint`` stops at a corrupt newest
checkpoint instead of quietly falling back to an older one.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import secrets
import shutil
import time
from typing import Any, Mapping, Protocol

import torch

from comlrl_core.run.rng import capture_rng_state, restore_rng_state

__all__ = [
    "CHECKPOINT_PREFIX",
    "CheckpointError",
    "NoCheckpointError",
    "NonFiniteStateError",
    "checkpoint_path",
    "cleanup_incomplete",
    "find_nonfinite_state",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "read_extra_file",
    "rotate_checkpoints",
    "save_checkpoint",
    "verify_checkpoint",
]

CHECKPOINT_PREFIX = "checkpoint-"
MANIFEST = "manifest.json"
FORMAT = "comlrl-checkpoint"
FORMAT_VERSION = 1
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_TMP_MARK = ".tmp-"
_OLD_MARK = ".old-"
_CORRUPT_MARK = ".corrupt-"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt, or lacks something asked for.

    ``incomplete`` is True when the save never finished (no manifest / no marker), as
    opposed to a finished checkpoint whose files were damaged later.
    """

    def __init__(self, message: str, *, incomplete: bool = False) -> None:
        super().__init__(message)
        self.incomplete = incomplete


class NonFiniteStateError(CheckpointError):
    """Optimizer parameters or state hold NaN/Inf: saving them would replace a good checkpoint."""


class NoCheckpointError(CheckpointError):
    """There is no checkpoint at all where one was looked for."""


class SavablePolicy(Protocol):
    def save(self, directory: str) -> None: ...

    def load(self, directory: str) -> None: ...


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


def checkpoint_path(root: str | os.PathLike, step: int, prefix: str = CHECKPOINT_PREFIX) -> pathlib.Path:
    """``root/checkpoint-000120`` for step 120 (zero-padded so names sort by step)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    return pathlib.Path(root) / f"{prefix}{step:06d}"


# -- low-level file helpers ---------------------------------------------------------------


def _fsync_file(path: pathlib.Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(path: pathlib.Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open folders; rename durability is then best effort
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_name(kind: str, name: str, allow_subdirs: bool = False) -> None:
    parts = name.split("/") if allow_subdirs else [name]
    if not isinstance(name, str) or not all(_NAME.match(p) for p in parts):
        raise ValueError(
            f"{kind} name {name!r} must be made of letters, digits, '_', '.', '-' "
            f"(not starting with '.' or '-'){' and may use / for folders' if allow_subdirs else ''}"
        )


def _check_json(value: Any, where: str) -> None:
    """The cursor must survive JSON exactly: no tuples, no non-str keys, no objects."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        return
    if isinstance(value, list):
        for i, v in enumerate(value):
            _check_json(v, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where} has a non-string key {k!r}; JSON keys are strings")
            _check_json(v, f"{where}[{k!r}]")
        return
    raise TypeError(
        f"{where} is a {type(value).__name__}; the cursor may hold only dict, list, str, int, float, bool and None"
    )


# -- save -----------------------------------------------------------------------------------


def save_checkpoint(
    directory: str | os.PathLike,
    *,
    policies: Mapping[str, SavablePolicy] | None = None,
    optimizers: Mapping[str, Stateful] | None = None,
    generators: Mapping[str, Any] | None = None,
    cursor: Mapping[str, Any] | None = None,
    extra_files: Mapping[str, bytes] | None = None,
    keep_last: int | None = None,
    allow_nonfinite: bool = False,
) -> pathlib.Path:
    """Write a checkpoint atomically to ``directory`` (replacing one of that name) and return it.

    ``optimizers`` takes any objects with ``state_dict`` / ``load_state_dict`` (LR
    schedulers and grad scalers too). ``generators`` are named ``torch.Generator`` /
    ``numpy.random.Generator`` objects; the global RNG states are always saved.
    ``keep_last`` then deletes all but the newest ``keep_last`` complete checkpoints
    next to it (the directory must be named ``checkpoint-<step>``).

    Raises :class:`NonFiniteStateError` before writing anything when an optimizer's
    parameters or state hold NaN/Inf (unless ``allow_nonfinite``). A checkpoint of the
    same name that fails its hashes is kept as ``<name>.corrupt-<random>``, not replaced.
    """
    final = pathlib.Path(directory)
    cursor = dict(cursor or {})
    _check_json(cursor, "cursor")
    for kind, names in (("policy", policies), ("optimizer", optimizers), ("generator", generators)):
        for name in names or {}:
            _check_name(kind, name)
    for name, data in (extra_files or {}).items():
        _check_name("extra file", name, allow_subdirs=True)
        if not isinstance(data, (bytes, bytearray)):
            raise TypeError(f"extra file {name!r} must be bytes, got {type(data).__name__}")
    if keep_last is not None and (keep_last < 1 or _step_of(final.name, CHECKPOINT_PREFIX) is None):
        raise ValueError("keep_last needs keep_last >= 1 and a directory named like checkpoint-000120")
    if final.exists() and not final.is_dir():
        raise CheckpointError(f"{final} exists and is not a folder")
    if not allow_nonfinite:
        problem = find_nonfinite_state(optimizers or {})
        if problem is not None:
            raise NonFiniteStateError(f"refusing to save {final}: {problem}")

    final.parent.mkdir(parents=True, exist_ok=True)
    if final.is_dir():
        _keep_if_corrupt(final)
    tmp = final.with_name(f"{final.name}{_TMP_MARK}{secrets.token_hex(4)}")
    tmp.mkdir()
    try:
        _write_contents(tmp, policies, optimizers, generators, cursor, extra_files)
        _install(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last is not None:
        rotate_checkpoints(final.parent, keep_last)
    return final


def _write_contents(tmp, policies, optimizers, generators, cursor, extra_files) -> None:
    for name, policy in (policies or {}).items():
        target = tmp / "policies" / name
        target.mkdir(parents=True)
        policy.save(str(target))
    if optimizers:
        (tmp / "optimizers").mkdir()
        for name, opt in optimizers.items():
            torch.save(opt.state_dict(), tmp / "optimizers" / f"{name}.pt")
    torch.save(capture_rng_state(generators), tmp / "rng.pt")
    (tmp / "cursor.json").write_text(json.dumps(cursor, indent=1, allow_nan=True), encoding="utf-8")
    for name, data in (extra_files or {}).items():
        target = tmp / "extra" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(bytes(data))

    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
        _fsync_file(path)
        files[path.relative_to(tmp).as_posix()] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "created": time.time(),
        "policies": sorted(policies or {}),
        "optimizers": sorted(optimizers or {}),
        "generators": sorted(generators or {}),
        "extra_files": sorted(extra_files or {}),
        "files": files,
        "complete": True,  # last key: a torn manifest cannot carry it
    }
    with open(tmp / MANIFEST, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    for folder in sorted((p for p in tmp.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        _fsync_dir(folder)
    _fsync_dir(tmp)


def _install(tmp: pathlib.Path, final: pathlib.Path) -> None:
    """Rename ``tmp`` to ``final``; an existing ``final`` is moved aside, then deleted."""
    aside = None
    if final.exists():
        aside = final.with_name(f"{final.name}{_OLD_MARK}{secrets.token_hex(4)}")
        os.replace(final, aside)
    try:
        os.replace(tmp, final)
    except BaseException:
        if aside is not None:
            os.replace(aside, final)  # put the old one back
        raise
    _fsync_dir(final.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _keep_if_corrupt(path: pathlib.Path) -> pathlib.Path | None:
    """Move a finished-but-damaged checkpoint aside (evidence), so a save never replaces it."""
    try:
        _verify_contents(path, verify_hashes=True)
    except CheckpointError as err:
        if err.incomplete:  # never finished: nothing worth keeping
            return None
        kept = path.with_name(f"{path.name}{_CORRUPT_MARK}{secrets.token_hex(4)}")
        os.replace(path, kept)
        _fsync_dir(path.parent)
        return kept
    return None


def find_nonfinite_state(optimizers: Mapping[str, Any]) -> str | None:
    """Describe the first NaN/Inf in the optimizers' parameters or state; None when all finite.

    Optimizers without ``param_groups`` / ``state`` (e.g. LR schedulers) are skipped.
    """
    for name, opt in optimizers.items():
        labelled: list[tuple[str, torch.Tensor]] = []
        for g, group in enumerate(getattr(opt, "param_groups", None) or []):
            for i, param in enumerate(group.get("params", [])):
                if isinstance(param, torch.Tensor) and param.is_floating_point():
                    labelled.append((f"parameter {i} of group {g}", param))
        for state in (getattr(opt, "state", None) or {}).values():
            for key, value in state.items() if isinstance(state, Mapping) else ():
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    labelled.append((f"state {key!r}", value))
        for label in _nonfinite_labels(labelled):
            return f"optimizer {name!r}: {label} holds NaN/Inf"
    return None


def _nonfinite_labels(labelled: list[tuple[str, torch.Tensor]]) -> list[str]:
    """Labels of the tensors holding NaN/Inf.

    A NaN or Inf anywhere makes a tensor's sum non-finite, so a finite sum clears it (one
    cheap reduction per tensor, one device sync in all); a non-finite sum may also be an
    overflow of large finite values, so only those tensors get the exact element check.
    """
    if not labelled:
        return []
    with torch.no_grad():
        device = labelled[0][1].device
        sums = torch.stack([t.detach().sum(dtype=torch.float32).to(device) for _, t in labelled])
        suspects = (~torch.isfinite(sums)).nonzero().flatten().tolist()
        return [labelled[i][0] for i in suspects if not bool(torch.isfinite(labelled[i][1].detach()).all())]


# -- verify / load --------------------------------------------------------------------------


def verify_checkpoint(directory: str | os.PathLike, *, verify_hashes: bool = True) -> dict[str, Any]:
    """Return the manifest of a complete, intact checkpoint; raise CheckpointError otherwise."""
    path = pathlib.Path(directory)
    if _TMP_MARK in path.name or _OLD_MARK in path.name:
        raise CheckpointError(f"{path} is a leftover of an interrupted save, not a checkpoint", incomplete=True)
    return _verify_contents(path, verify_hashes)


def _verify_contents(path: pathlib.Path, verify_hashes: bool) -> dict[str, Any]:
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint at {path}")
    manifest_path = path / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path} has no {MANIFEST}: incomplete checkpoint", incomplete=True) from None
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(
            f"{manifest_path} is unreadable ({err}): incomplete checkpoint", incomplete=True
        ) from None
    if not isinstance(manifest, dict) or manifest.get("complete") is not True:
        raise CheckpointError(f"{path} is not marked complete: incomplete checkpoint", incomplete=True)
    if manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: unsupported checkpoint format {manifest.get('format')!r} v{manifest.get('version')!r}"
        )
    for rel, info in manifest.get("files", {}).items():
        file = path / rel
        if not file.is_file():
            raise CheckpointError(f"{path}: file {rel} is missing")
        size = file.stat().st_size
        if size != info["size"]:
            raise CheckpointError(f"{path}: file {rel} has {size} bytes, the manifest says {info['size']}")
        if verify_hashes and _sha256(file) != info["sha256"]:
            raise CheckpointError(f"{path}: file {rel} does not match its sha256 in the manifest (corrupt)")
    return manifest


def _require(kind: str, asked: Mapping[str, Any] | None, saved: list[str], path: pathlib.Path) -> None:
    missing = sorted(set(asked or {}) - set(saved))
    if missing:
        raise CheckpointError(f"{path} has no {kind} named {missing}; it has {saved}")


def load_checkpoint(
    directory: str | os.PathLike,
    *,
    policies: Mapping[str, SavablePolicy] | None = None,
    optimizers: Mapping[str, Stateful] | None = None,
    generators: Mapping[str, Any] | None = None,
    restore_rng: bool = True,
    verify_hashes: bool = True,
) -> dict[str, Any]:
    """Verify, then restore the given objects (and, with ``restore_rng``, the global RNGs).

    Returns the cursor.

    Every requested name must be in the checkpoint; this is checked before any state
    changes. Objects not passed are left alone.
    """
    path = pathlib.Path(directory)
    manifest = verify_checkpoint(path, verify_hashes=verify_hashes)
    _require("policy", policies, manifest["policies"], path)
    _require("optimizer", optimizers, manifest["optimizers"], path)
    _require("generator", generators, manifest["generators"], path)

    for name, policy in (policies or {}).items():
        policy.load(str(path / "policies" / name))
    for name, opt in (optimizers or {}).items():
        state = torch.load(path / "optimizers" / f"{name}.pt", map_location="cpu", weights_only=True)
        try:
            opt.load_state_dict(state)
        except (ValueError, KeyError, RuntimeError) as err:
            raise CheckpointError(f"{path}: optimizer {name!r} does not match the saved state: {err}") from err
    if restore_rng or generators:
        state = torch.load(path / "rng.pt", map_location="cpu", weights_only=True)
        restore_rng_state(state, generators, restore_globals=restore_rng)
    return json.loads((path / "cursor.json").read_text(encoding="utf-8"))


def read_extra_file(directory: str | os.PathLike, name: str, *, verify_hashes: bool = True) -> bytes:
    """The bytes saved as ``extra_files[name]`` (after verifying the checkpoint)."""
    path = pathlib.Path(directory)
    manifest = verify_checkpoint(path, verify_hashes=verify_hashes)
    if name not in manifest["extra_files"]:
        raise CheckpointError(f"{path} has no extra file {name!r}; it has {manifest['extra_files']}")
    return (path / "extra" / name).read_bytes()


# -- discovery and housekeeping ---------------------------------------------------------------


def _step_of(name: str, prefix: str) -> int | None:
    match = re.fullmatch(re.escape(prefix) + r"(\d+)", name)
    return int(match.group(1)) if match else None


def _numbered(root: pathlib.Path, prefix: str) -> list[tuple[int, pathlib.Path]]:
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        step = _step_of(entry.name, prefix)
        if step is not None and entry.is_dir():
            found.append((step, entry))
    return sorted(found)


def _is_complete(path: pathlib.Path, verify_hashes: bool) -> bool:
    try:
        verify_checkpoint(path, verify_hashes=verify_hashes)
    except CheckpointError:
        return False
    return True


def list_checkpoints(
    root: str | os.PathLike, *, prefix: str = CHECKPOINT_PREFIX, verify_hashes: bool = False
) -> list[pathlib.Path]:
    """Complete checkpoints under ``root``, oldest step first (sizes checked; hashes if asked)."""
    return [p for _, p in _numbered(pathlib.Path(root), prefix) if _is_complete(p, verify_hashes)]


def latest_checkpoint(
    root: str | os.PathLike, *, prefix: str = CHECKPOINT_PREFIX, verify_hashes: bool = True
) -> pathlib.Path | None:
    """The complete checkpoint with the highest step under ``root``, or None.

    Leftovers of interrupted saves (``*.tmp-*``, ``*.old-*``) and incomplete or corrupt
    checkpoints are skipped, falling back to the next older one.
    """
    for _, path in reversed(_numbered(pathlib.Path(root), prefix)):
        if _is_complete(path, verify_hashes):
            return path
    return None


def rotate_checkpoints(
    root: str | os.PathLike, keep_last: int, *, prefix: str = CHECKPOINT_PREFIX
) -> list[pathlib.Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints; return what was deleted."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    complete = list_checkpoints(root, prefix=prefix)
    doomed = complete[: max(0, len(complete) - keep_last)]
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def cleanup_incomplete(
    root: str | os.PathLike, *, prefix: str = CHECKPOINT_PREFIX, remove_corrupt: bool = False
) -> list[pathlib.Path]:
    """Remove leftovers of interrupted saves under ``root``; return what was removed.

    ``*.tmp-*`` folders are deleted. An ``*.old-*`` folder (a save died between moving
    the previous checkpoint aside and deleting it) is renamed back when its original
    name is free and it is intact, else deleted. Numbered checkpoints without a
    complete manifest are deleted; ones that fail their hashes only with
    ``remove_corrupt`` (they may deserve a look).
    """
    root = pathlib.Path(root)
    removed: list[pathlib.Path] = []
    if not root.is_dir():
        return removed
    for entry in sorted(root.iterdir()):
        if not entry.is_dir() or not entry.name.startswith(prefix):
            continue
        if _TMP_MARK in entry.name:
            shutil.rmtree(entry)
            removed.append(entry)
        elif _OLD_MARK in entry.name:
            original = entry.with_name(entry.name.split(_OLD_MARK, 1)[0])
            try:
                _verify_contents(entry, verify_hashes=True)
                intact = True
            except CheckpointError:
                intact = False
            if intact and not original.exists():
                os.replace(entry, original)
                _fsync_dir(root)
            else:
                shutil.rmtree(entry)
                removed.append(entry)
    for _, path in _numbered(root, prefix):
        try:
            verify_checkpoint(path, verify_hashes=remove_corrupt)
        except CheckpointError as err:
            if err.incomplete or remove_corrupt:
                shutil.rmtree(path)
                removed.append(path)
    return removed
