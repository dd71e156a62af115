"""Start-up checks: find bad input before any model is loaded or any step is run.

Each check raises :class:`PreflightError` (a ``comlrl_core.cli.UsageError``: the command
line prints it as one or two lines and exits with code 2) naming the option and the fix:

* :func:`check_output_dir` -- the run folder is a folder we can write (created, then a
  probe file written, synced and removed);
* :func:`check_environment` -- the env id is registered and builds with the config's
  env kwargs (once, tasks loaded, then closed); returns its agent names;
* :func:`check_model_sources` -- every model option resolves (aliases, folders and GGUF
  files on disk; a hub id from the local cache, else by fetching only its config);
* :func:`check_team_size` -- ``agent_models`` / ``num_agents`` fit the env's agents;
* :func:`check_resume` -- the checkpoint to resume exists, is intact (hashes verified)
  and was written by this algorithm; leftovers of a killed save are tidied first.

:func:`check_training_start` runs them all for ``comlrl train``.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import secrets
import sys
from typing import Any, Iterable, Sequence

from comlrl_core.cli import UsageError
from comlrl_core.run.checkpoint import (
    CheckpointError,
    NoCheckpointError,
    verify_checkpoint,
)
from comlrl_core.run.checkpoint_recovery import find_resume_checkpoint, recover_leftovers

__all__ = [
    "PreflightError",
    "check_environment",
    "check_model_sources",
    "check_output_dir",
    "check_resume",
    "check_team_size",
    "check_training_start",
    "env_build_kwargs",
    "model_options",
]


class PreflightError(UsageError):
    """Bad input found at start-up, before any work (exit code 2 on the command line)."""


# -- output folder --------------------------------------------------------------------------


def check_output_dir(path: str | os.PathLike, option: str = "output_dir") -> pathlib.Path:
    """Create ``path`` if needed and prove it writable with a probe file; return it."""
    folder = pathlib.Path(path)
    fix = f"set {option} to a folder you can write"
    if folder.exists() and not folder.is_dir():
        raise PreflightError(f"option '{option}': {folder} is a file, not a folder; {fix}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in folder.parents if p.exists() and not p.is_dir()), None)
        where = f"{blocker} is a file" if blocker else "a part of the path is not a folder"
        raise PreflightError(f"option '{option}': cannot create {folder}: {where}; {fix}") from None
    except OSError as err:
        raise PreflightError(f"option '{option}': cannot create {folder}: {_reason(err)}; {fix}") from None
    probe = folder / f".comlrl-write-probe-{secrets.token_hex(4)}"
    try:
        with open(probe, "xb") as handle:
            handle.write(b"probe")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as err:
        raise PreflightError(f"option '{option}': {folder} is not writable: {_reason(err)}; {fix}") from None
    finally:
        try:
            probe.unlink()
        except FileNotFoundError:
            pass
    return folder


def _reason(err: OSError) -> str:
    if err.errno == errno.EROFS:
        return "read-only file system"
    if err.errno in (errno.EPERM, errno.EACCES):
        return "permission denied (read-only or immutable)"
    return err.strerror or str(err)


# -- environment ----------------------------------------------------------------------------


def env_build_kwargs(config: Any, task_slice: str | None) -> dict[str, Any]:
    """The kwargs a trainer builds its env with: the config's turn options, then ``env_kwargs``."""
    kwargs: dict[str, Any] = {}
    for name in ("num_turns", "early_termination_threshold"):
        value = getattr(config, name, None)
        if value is not None:
            kwargs[name] = value
    kwargs.update(getattr(config, "env_kwargs", None) or {})
    if task_slice is not None:
        kwargs["task_slice"] = task_slice
    return kwargs


def check_environment(env_id: str, env_kwargs: dict[str, Any], *, kwargs_option: str = "env_kwargs") -> list[str]:
    """Build ``env_id`` once with ``env_kwargs`` (tasks loaded), close it; return its agent names."""
    from comlrl_core.registry import make, registered_ids

    if env_id not in registered_ids(None):
        namespace = env_id.split("/")[0] if "/" in env_id else "comlrl"
        known = registered_ids(namespace) or registered_ids("comlrl")
        raise PreflightError(
            f"unknown environment id {env_id!r}; pass --env with a registered id: {', '.join(known) or 'none'}"
        )
    try:
        env = make(env_id, **env_kwargs)
    except Exception as err:  # any constructor failure is bad input here; the message says which
        raise PreflightError(
            f"option '{kwargs_option}': {env_id} cannot be built with {_brief(env_kwargs)}: {_one_line(err)}; "
            f"fix or remove the offending {kwargs_option} entry"
        ) from err
    try:
        agents = list(env.possible_agents)
        count = getattr(env, "num_tasks", None)  # loads the tasks: a bad data file shows here
        if count is not None and (not isinstance(count, int) or count < 1):
            raise PreflightError(
                f"option '{kwargs_option}': {env_id} with {_brief(env_kwargs)} has no tasks; check the task slice"
            )
    except PreflightError:
        raise
    except Exception as err:
        raise PreflightError(
            f"option '{kwargs_option}': {env_id} cannot load its tasks with {_brief(env_kwargs)}: {_one_line(err)}"
        ) from err
    finally:
        env.close()
    return agents


def _brief(kwargs: dict[str, Any]) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "no arguments"
    return text if len(text) <= 200 else text[:197] + "..."


def _one_line(err: BaseException | str) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def check_team_size(config: Any, agents: Sequence[str]) -> None:
    """``agent_models`` / ``num_agents`` must give one model per agent of the env."""
    models = list(getattr(config, "agent_models", None) or [])
    count = getattr(config, "num_agents", None)
    if count is not None and count != len(agents):
        raise PreflightError(
            f"option 'num_agents' is {count} but the environment has {len(agents)} agents {agents}; "
            f"set num_agents={len(agents)} or leave it unset"
        )
    if len(models) > 1 and len(models) != len(agents):
        raise PreflightError(
            f"option 'agent_models' names {len(models)} models for {len(agents)} agents {agents}; "
            "give one model per agent, or one for all"
        )


# -- models ---------------------------------------------------------------------------------


def model_options(config: Any) -> list[tuple[str, str]]:
    """``(option, model source)`` for every model a learner config names."""
    found = [("agent_models", m) for m in getattr(config, "agent_models", None) or []]
    for name in ("critic_model", "reward_model_name", "comparator_model_name"):
        value = getattr(config, name, None)
        if isinstance(value, str) and value:
            found.append((name, value))
    return found


def check_model_sources(sources: Iterable[tuple[str, str]]) -> None:
    """Resolve every ``(option, source)`` without loading weights."""
    from comlrl_core.models.model_source import ModelSourceError, resolve_model_source

    seen: set[str] = set()
    for option, spec in sources:
        if spec in seen:
            continue
        seen.add(spec)
        try:
            source = resolve_model_source(spec)
        except ModelSourceError as err:
            raise PreflightError(f"option '{option}': {err}") from None
        if source.kind == "hub":
            _check_hub_model(option, spec)


def _check_hub_model(option: str, repo_id: str) -> None:
    """A hub id must be in the local cache or fetchable (config.json only, not the weights)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
            return
    except Exception:  # an odd cache layout: fall through to the fetch
        pass
    try:
        from transformers import AutoConfig

        AutoConfig.from_pretrained(repo_id)
    except Exception as err:
        raise PreflightError(
            f"option '{option}': model {repo_id!r} is not in the local Hugging Face cache and could not be "
            f"fetched ({_one_line(err)[:160]}); use a local folder, a .gguf file or an alias"
        ) from None


# -- resume ---------------------------------------------------------------------------------


def check_resume(
    run_dir: pathlib.Path,
    resume_from: str | None,
    algorithm_name: str | None,
    *,
    skip_corrupt: bool = False,
) -> pathlib.Path:
    """The checkpoint to resume, verified (hashes) and written by ``algorithm_name``.

    ``resume_from`` None: the newest under ``run_dir/checkpoints``; a damaged newest one
    stops here unless ``skip_corrupt``, which falls back to the newest intact one and
    says which were skipped (on stderr).
    """
    root = run_dir / "checkpoints"
    recover_leftovers(root)
    if resume_from:
        path = pathlib.Path(resume_from)
        try:
            verify_checkpoint(path)
        except CheckpointError as err:
            raise PreflightError(
                f"--resume-from: {_one_line(err)}; give an intact checkpoint folder (checkpoint-NNNNNN)"
            ) from None
    else:
        try:
            path, skipped = find_resume_checkpoint(root, skip_corrupt=skip_corrupt)
        except NoCheckpointError as err:
            raise PreflightError(f"--resume: {err}; drop --resume to start a new run") from None
        except CheckpointError as err:
            hint = (
                "; look at it, or resume an older one with --resume-from PATH "
                "(or --resume-skip-corrupt to use the newest intact one)"
                if not skip_corrupt
                else "; start a new run without --resume"
            )
            raise PreflightError(f"--resume: {_one_line(err)}{hint}") from None
        for bad, reason in skipped:
            print(f"--resume-skip-corrupt: skipping {bad} (kept for inspection): {_one_line(reason)}", file=sys.stderr)
    if algorithm_name is not None:
        try:
            cursor = json.loads((path / "cursor.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cursor = {}
        written_by = cursor.get("algorithm") if isinstance(cursor, dict) else None
        if written_by is not None and written_by != algorithm_name:
            raise PreflightError(
                f"checkpoint {path} was written by {written_by}, not {algorithm_name}; "
                f"resume it with the algorithm that wrote it"
            )
    return path


# -- all of it ------------------------------------------------------------------------------


def check_training_start(
    config: Any,
    env_id: str,
    *,
    algorithm_name: str | None = None,
    resume: bool = False,
    resume_from: str | None = None,
    skip_corrupt: bool = False,
    tidy: bool = True,
) -> pathlib.Path | None:
    """Every start-up check of ``comlrl train``, cheapest first; return the checkpoint to resume.

    ``tidy``: clean ``.tmp-*`` leftovers and restore an intact ``.old-*`` checkpoint
    under ``output_dir/checkpoints`` (only one process of a distributed run should).
    """
    run_dir = check_output_dir(config.output_dir)
    owned = sorted(k for k in ("num_turns", "early_termination_threshold") if hasattr(config, k))
    clash = [k for k in owned if k in (getattr(config, "env_kwargs", None) or {})]
    if clash:
        raise PreflightError(
            f"option 'env_kwargs' sets {', '.join(clash)}, which the trainer sets itself; "
            f"use the option{'s' if len(clash) > 1 else ''} of the same name instead"
        )
    agents = check_environment(env_id, env_build_kwargs(config, getattr(config, "train_task_slice", None)))
    eval_slice = getattr(config, "eval_task_slice", None)
    if eval_slice is not None:
        check_environment(env_id, env_build_kwargs(config, eval_slice), kwargs_option="eval_task_slice")
    check_team_size(config, agents)
    check_model_sources(model_options(config))
    if tidy:
        recover_leftovers(run_dir / "checkpoints")
    if not (resume or resume_from or skip_corrupt):
        return None
    return check_resume(run_dir, resume_from, algorithm_name, skip_corrupt=skip_corrupt)
