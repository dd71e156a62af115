"""Export a trained team from a checkpoint as plain Hugging Face folders.

Public API::

    export_checkpoint(path, out, *, adapters_only=False, base_model=None) -> list[ExportedAgent]
        ``path``: a checkpoint folder (``RUN_DIR/checkpoints/checkpoint-N``) or a run
        folder (its latest complete checkpoint). Writes ``out/agent_<i>`` per agent.
    ExportedAgent(name, folder, kind)        kind: "merged", "full" or "adapter"

What each agent becomes:

* default: a standalone model folder (``config.json``, ``model.safetensors``, tokenizer)
  that ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``
  load with nothing of this package installed. A LoRA agent's adapter is merged into
  its base weights; a fully trained agent's folder is its ``save_pretrained`` output.
* ``adapters_only``: a PEFT adapter folder (``adapter_config.json`` +
  ``adapter_model.safetensors``) whose ``base_model_name_or_path`` is portable -- a hub
  id or an alias this package resolves (e.g. ``smollm2-135m-instruct``), never a path
  of this machine. ``base_model`` overrides it (needed when the run trained on a local
  folder, whose path would mean nothing elsewhere). Fully trained agents have no adapter
  and are written as model folders.

An exported adapter folder is also a model source (``AgentSpec.model`` / ``agent_models``):
a warm start for another run.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
from dataclasses import dataclass
from typing import Any, Literal

from comlrl_core.models.lora import ADAPTER_WEIGHTS, merge_lora_adapter
from comlrl_core.models.model_source import (
    ADAPTER_CONFIG,
    POLICY_META,
    load_causal_lm,
    load_tokenizer,
    portable_model_name,
    resolve_model_source,
)
from comlrl_core.run.checkpoint import MANIFEST, CheckpointError, latest_checkpoint, verify_checkpoint

__all__ = ["ExportedAgent", "export_checkpoint", "find_checkpoint"]

_AGENT = re.compile(r"^agent_(\d+)$")


@dataclass(frozen=True)
class ExportedAgent:
    name: str
    folder: pathlib.Path
    kind: Literal["merged", "full", "adapter"]


def find_checkpoint(path: str | os.PathLike) -> pathlib.Path:
    """The checkpoint folder ``path`` names: itself, or a run folder's latest complete one."""
    p = pathlib.Path(path)
    if (p / MANIFEST).is_file():
        verify_checkpoint(p)
        return p
    for root in (p / "checkpoints", p):
        if root.is_dir():
            found = latest_checkpoint(root)
            if found is not None:
                return found
    raise CheckpointError(
        f"{p} is neither a checkpoint folder (with {MANIFEST}) nor a run folder with a complete checkpoint "
        "under checkpoints/ (did the run set save_final_checkpoint or save_steps?)"
    )


def _agent_folders(checkpoint: pathlib.Path) -> list[pathlib.Path]:
    policies = checkpoint / "policies"
    folders = [d for d in policies.iterdir() if d.is_dir()] if policies.is_dir() else []
    if not folders:
        raise CheckpointError(f"{checkpoint} holds no trained agents (no policies/ folder)")
    # agent_10 after agent_9: by index when the names are agent_<i>
    return sorted(folders, key=lambda d: (0, int(m.group(1)), "") if (m := _AGENT.match(d.name)) else (1, 0, d.name))


def _kind(folder: pathlib.Path) -> str:
    meta = folder / POLICY_META
    if meta.is_file():
        return str(json.loads(meta.read_text(encoding="utf-8")).get("kind"))
    return "lora" if (folder / ADAPTER_CONFIG).is_file() else "full"


def _write_full(folder: pathlib.Path, target: pathlib.Path) -> None:
    """A fully trained agent is already a ``save_pretrained`` folder: copy it, minus our notes."""
    shutil.copytree(folder, target, ignore=shutil.ignore_patterns(POLICY_META))


def _write_merged(folder: pathlib.Path, target: pathlib.Path) -> None:
    source = resolve_model_source(str(folder))  # an adapter folder: its base, plus the adapter
    model: Any = merge_lora_adapter(load_causal_lm(source), str(folder))
    model.save_pretrained(str(target), safe_serialization=True)
    load_tokenizer(source).save_pretrained(str(target))


def _write_adapter(folder: pathlib.Path, target: pathlib.Path, base_model: str | None) -> None:
    if base_model is not None and (os.path.isabs(base_model) or base_model.startswith((".", "~"))):
        raise ValueError(f"base_model {base_model!r} is a path; give the base's hub id or alias")
    if base_model is None:
        base_model = portable_model_name(resolve_model_source(str(folder)))
    if base_model is None:
        raise ValueError(
            f"{folder}: the run's base model is a local path, which means nothing on another machine; "
            "give the base's hub id or alias with --base-model (base_model=)"
        )
    target.mkdir(parents=True)
    shutil.copy2(folder / ADAPTER_WEIGHTS, target / ADAPTER_WEIGHTS)
    config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    config["base_model_name_or_path"] = base_model
    (target / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def export_checkpoint(
    path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    adapters_only: bool = False,
    base_model: str | None = None,
) -> list[ExportedAgent]:
    """Write every agent of the checkpoint at ``path`` under ``out`` (see the module doc).

    ``out`` must not exist or be empty: an export never mixes with older files.
    """
    checkpoint = find_checkpoint(path)
    out = pathlib.Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder; choose a new --out folder")
    folders = _agent_folders(checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    exported: list[ExportedAgent] = []
    for folder in folders:
        target = out / folder.name
        if _kind(folder) != "lora":
            _write_full(folder, target)
            exported.append(ExportedAgent(folder.name, target, "full"))
        elif adapters_only:
            _write_adapter(folder, target, base_model)
            exported.append(ExportedAgent(folder.name, target, "adapter"))
        else:
            _write_merged(folder, target)
            exported.append(ExportedAgent(folder.name, target, "merged"))
    return exported
