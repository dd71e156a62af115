"""A :class:`~comlrl_core.models.hf_policy.TransformersPolicy` on disk (any
:class:`StoredPolicy`): what
``policy.save(directory)`` writes and ``policy.load(directory)`` reads back.

- A LoRA agent: its adapter only (peft's layout, safetensors), through the shared base
  (``SharedLoraBase.save_adapter`` / ``load_adapter``).
- A fully trainable agent: a ``save_pretrained`` folder (safetensors) and its tokenizer.
  Loading reads the safetensors files (one, or the shards of an index) into the model in
  place. It refuses weights the model lacks, and a weight missing from the files unless
  it is tied to one they hold (SmolLM2's output layer and embeddings); both are checked
  on the files' names before any weight is loaded, so a refused checkpoint changes nothing.

Both write ``POLICY_META`` beside the weights: format, kind (lora / full), the agent's
name, its base model as something that moves to another machine (an alias or hub id where
the base has one; for a warm start, the base, not the adapter) and the adapter's name.
Loading a checkpoint of the other kind is refused with the directory and both kinds named.

Public API::

    StoredPolicy  (what a policy gives these: model, tokenizer, name, adapter_name, spec, source, is_lora, _lora())
    save_policy(policy, directory)
    load_policy(policy, directory)
    portable_source(policy) -> str | None
"""

from __future__ import annotations

import json
import os
from typing import Any, Protocol, cast

from torch import nn

from comlrl_core.models.agent_spec import AgentSpec
from comlrl_core.models.lora import SharedLoraBase
from comlrl_core.models.model_source import POLICY_META, ModelSource, portable_model_name


class StoredPolicy(Protocol):
    """What saving and loading read of a policy (a ``TransformersPolicy``; named by its
    parts so that this module does not import the policy, which imports it)."""

    model: nn.Module
    tokenizer: Any
    name: str
    adapter_name: str | None
    spec: AgentSpec | None
    source: ModelSource | None

    @property
    def is_lora(self) -> bool: ...

    def _lora(self) -> tuple[SharedLoraBase, str] | None:
        """(shared base, adapter name) of a LoRA policy; None for a full one."""
        ...


def save_policy(policy: StoredPolicy, directory: str) -> None:
    """LoRA: adapter only (peft layout, safetensors). Full: ``save_pretrained`` folder."""
    os.makedirs(directory, exist_ok=True)
    source = portable_source(policy)
    meta = {
        "format": 1,
        "kind": "lora" if policy.is_lora else "full",
        "name": policy.name,
        "source": source,
        "adapter_name": policy.adapter_name,
    }
    lora = policy._lora()
    if lora is not None:
        shared, adapter = lora
        shared.save_adapter(adapter, directory, base_model=source)
    else:
        # a transformers model (nn.Module's __getattr__ would type the method as a tensor)
        cast(Any, policy.model).save_pretrained(directory, safe_serialization=True)
        policy.tokenizer.save_pretrained(directory)
    with open(os.path.join(directory, POLICY_META), "w") as f:
        json.dump(meta, f, indent=2)


def portable_source(policy: StoredPolicy) -> str | None:
    """The base model to record with saved weights: an alias or hub id when the base has
    one (it moves to another machine), else the spec's model as given."""
    if policy.source is not None:
        portable = portable_model_name(policy.source)
        if portable is not None:
            return portable
        if policy.source.adapter is not None:  # a warm start: record the base, not the adapter
            src = policy.source
            return os.path.join(src.path, src.gguf_file) if src.gguf_file else src.path
    return policy.spec.model if policy.spec else None


def load_policy(policy: StoredPolicy, directory: str) -> None:
    """Load weights saved by :func:`save_policy` into ``policy``, in place."""
    meta_path = os.path.join(directory, POLICY_META)
    if os.path.isfile(meta_path):
        with open(meta_path) as f:
            kind = json.load(f).get("kind")
        mine = "lora" if policy.is_lora else "full"
        if kind != mine:
            raise ValueError(f"{directory} holds a {kind} checkpoint but policy {policy.name!r} is {mine}")
    lora = policy._lora()
    if lora is not None:
        shared, adapter = lora
        shared.load_adapter(adapter, directory)
    else:
        load_full_weights(policy.model, directory)


def load_full_weights(model: nn.Module, directory: str) -> None:
    """A ``save_pretrained`` folder's safetensors weights into ``model``, in place. Every
    file's names are checked before any weight is loaded, so a refused checkpoint leaves
    the model as it was."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.isfile(os.path.join(directory, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"no model.safetensors (or index) in {directory}")
    expected = model.state_dict()
    held: dict[str, list[str]] = {}
    for name in files:
        with safe_open(os.path.join(directory, name), framework="pt") as f:
            held[name] = list(f.keys())
        unknown = sorted(set(held[name]) - set(expected))
        if unknown:
            raise ValueError(f"{directory}/{name} has weights this model lacks: {unknown[:5]}")
    # weights absent from the files must be tied to ones that are there (e.g. lm_head)
    present = {key for keys in held.values() for key in keys}
    present_ptrs = {expected[k].data_ptr() for k in present}
    missing = [k for k in expected if k not in present and expected[k].data_ptr() not in present_ptrs]
    if missing:
        raise ValueError(f"{directory} lacks weights for {missing[:5]}")
    device = str(next(model.parameters()).device)
    for name in files:
        model.load_state_dict(load_file(os.path.join(directory, name), device=device), strict=False)
