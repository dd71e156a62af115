"""LoRA through peft: one frozen base model shared by several agents' adapters.

Public API::

    transformers_model(model) -> the transformers model under a peft wrapper (or ``model``)
    find_lora_target_modules(model) -> list[str]
        Names (last path component) of every Linear layer inside the decoder blocks;
        ``lm_head`` and embeddings are never included.
    enable_gradient_checkpointing(model, context_fn=None) / is_checkpointing(model)
    SharedLoraBase(base_model)
        .add_adapter(name, r, alpha, dropout, target_modules=None)
        .activate(name)                  -- make ``name`` the adapter used by forward passes
        .adapter_parameters(name) -> list[Parameter]   (that adapter only)
        .save_adapter(name, directory, base_model=None) / .load_adapter(name, directory)
        .model                           -- the PeftModel; .adapter_names
    adapter_lora_settings(directory) -> dict   r, alpha, dropout, target_modules of a saved adapter
    merge_lora_adapter(model, directory) -> nn.Module   the model with the adapter merged in

Why the care around ``set_adapter``: peft's ``set_adapter`` also sets ``requires_grad``
-- True on the adapter it activates and False on all others. With several agents on
one base, agent 0's parameters would then be silently frozen whenever agent 1 ran
last (an optimizer built from ``requires_grad`` params, or a forward pass after the
switch, would skip them). ``activate`` re-enables every adapter's gradients after the
switch; only the active adapter takes part in a forward pass, so gradients still
reach exactly the agent that ran. Likewise, with gradient checkpointing a layer is
recomputed during backward -- possibly after another agent switched adapters -- so the
recomputation re-activates the adapter that was active at forward time.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import TYPE_CHECKING, Any, Callable, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from peft import PeftModel

ADAPTER_WEIGHTS = "adapter_model.safetensors"


def transformers_model(model: nn.Module) -> Any:
    """The transformers model under a peft wrapper (its ``get_base_model()``), else
    ``model`` itself. Typed loosely: callers read transformers' attributes off it."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model


def _decoder_blocks(model: nn.Module) -> nn.ModuleList | None:
    """The decoder blocks: the longest ModuleList in the model."""
    best: nn.ModuleList | None = None
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and (best is None or len(module) > len(best)):
            best = module
    return best


def find_lora_target_modules(model: nn.Module) -> list[str]:
    """All Linear layers inside the decoder blocks (GPT-2 style Conv1D included)."""
    linear_types: tuple[type, ...] = (nn.Linear,)
    try:  # GPT-2 family stores its projections as transformers' Conv1D
        from transformers.pytorch_utils import Conv1D

        linear_types = (nn.Linear, Conv1D)
    except ImportError:  # pragma: no cover - very old transformers
        pass
    blocks = _decoder_blocks(model)
    if blocks is None:
        raise ValueError(
            f"cannot find the decoder blocks of {type(model).__name__} to place LoRA on; "
            "pass lora_target_modules=[...] explicitly"
        )
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in blocks.named_modules()
        if isinstance(module, linear_types)
        and name
        # skip layers peft itself added (when the model already carries adapters)
        and not any(part.startswith("lora_") or part == "base_layer" for part in name.split("."))
    }
    names.discard("lm_head")
    if not names:
        raise ValueError(
            f"no Linear layers found in the decoder blocks of {type(model).__name__}; "
            "pass lora_target_modules=[...] explicitly"
        )
    return sorted(names)


def enable_gradient_checkpointing(model: nn.Module, context_fn: Callable | None = None) -> None:
    """Non-reentrant activation checkpointing (works with a frozen base, no input-grad hack).

    ``context_fn`` (torch.utils.checkpoint) returns (forward ctx, recompute ctx) each time a
    layer is checkpointed; SharedLoraBase uses it to recompute with the right adapter.
    """
    kwargs: dict = {"use_reentrant": False}
    if context_fn is not None:
        kwargs["context_fn"] = context_fn
    # transformers >= 5.x names it activation_checkpointing_enable (the old name warns)
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        # a transformers model (nn.Module's __getattr__ would type the method as a tensor)
        cast(Any, model).gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def is_checkpointing(model: nn.Module) -> bool:
    flag = getattr(type(model), "is_activation_checkpointing", None)  # transformers >= 5.x
    if flag is not None:
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


class _AdapterDuring:
    """Context manager: ``name`` active inside, the previous adapter restored after."""

    def __init__(self, shared: "SharedLoraBase", name: str | None) -> None:
        self.shared, self.name = shared, name
        self.previous: str | None = None

    def __enter__(self) -> None:
        self.previous = self.shared.active_adapter
        if self.name is not None:
            self.shared.activate(self.name)

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            self.shared.activate(self.previous)


def _is_adapter_param(param_name: str, adapter: str) -> bool:
    parts = param_name.split(".")
    return adapter in parts and any(p.startswith("lora_") for p in parts)


class SharedLoraBase:
    """A frozen base model wrapped in one ``PeftModel`` that holds one adapter per agent."""

    def __init__(self, base_model: nn.Module) -> None:
        self._base = base_model
        self.model: PeftModel | None = None  # created with the first adapter
        self._active: str | None = None
        self._params: dict[str, list[nn.Parameter]] = {}
        self._auto_targets = find_lora_target_modules(base_model)  # before peft wraps layers
        if is_checkpointing(base_model):
            # Checkpointed layers are recomputed during backward, maybe after another agent
            # activated its adapter: recompute with the adapter active at forward time.
            enable_gradient_checkpointing(base_model, context_fn=self._checkpoint_contexts)

    def _checkpoint_contexts(self):
        return contextlib.nullcontext(), _AdapterDuring(self, self._active)

    def peft_model(self) -> PeftModel:
        """The PeftModel holding every adapter (made with the first one)."""
        if self.model is None:
            raise RuntimeError("this SharedLoraBase has no adapter yet: call add_adapter first")
        return self.model

    @property
    def adapter_names(self) -> list[str]:
        return list(self._params)

    @property
    def base_model(self) -> nn.Module:
        return self._base

    def add_adapter(
        self,
        name: str,
        r: int,
        alpha: float,
        dropout: float,
        target_modules: list[str] | None = None,
    ) -> None:
        from peft import LoraConfig, get_peft_model

        if name in self._params:
            raise ValueError(f"adapter {name!r} already exists on this base")
        config = LoraConfig(
            r=r,
            lora_alpha=alpha,  # type: ignore[arg-type]  # peft annotates int; scaling is alpha / r, any number
            lora_dropout=dropout,
            target_modules=list(target_modules or self._auto_targets),
            bias="none",
            task_type="CAUSAL_LM",
        )
        if self.model is None:
            # get_peft_model freezes every base parameter: only adapters train.
            self.model = get_peft_model(self._base, config, adapter_name=name)
        else:
            self.model.add_adapter(name, config)
        self._params[name] = [p for n, p in self.peft_model().named_parameters() if _is_adapter_param(n, name)]
        if not self._params[name]:
            raise RuntimeError(f"peft created no parameters for adapter {name!r}")
        self._active = None  # add_adapter may change requires_grad; re-activate next time
        self.activate(name)

    def activate(self, name: str) -> None:
        """Route forward passes through adapter ``name``; keep every adapter trainable."""
        if name not in self._params:
            raise KeyError(f"no adapter {name!r}; have {self.adapter_names}")
        if self._active == name:
            return
        self.peft_model().set_adapter(name)
        # peft just set requires_grad=False on the other adapters -- undo that, see module doc
        for params in self._params.values():
            for p in params:
                p.requires_grad_(True)
        self._active = name

    @property
    def active_adapter(self) -> str | None:
        return self._active

    def adapter_parameters(self, name: str) -> list[nn.Parameter]:
        return list(self._params[name])

    def adapter_config_dict(self, name: str) -> dict:
        return self.peft_model().peft_config[name].to_dict()

    def save_adapter(self, name: str, directory: str, base_model: str | None = None) -> None:
        """peft's layout: ``adapter_config.json`` + ``adapter_model.safetensors``.

        ``base_model`` is recorded as ``base_model_name_or_path`` (a hub id or an alias
        moves to another machine; peft would record the folder the base was loaded from,
        e.g. a GGUF inside this machine's site-packages)."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        os.makedirs(directory, exist_ok=True)
        state = get_peft_model_state_dict(self.peft_model(), adapter_name=name)
        state = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
        save_file(state, os.path.join(directory, ADAPTER_WEIGHTS), metadata={"format": "pt"})
        config = self.adapter_config_dict(name)
        config["target_modules"] = sorted(config.get("target_modules") or [])
        config["peft_type"] = str(getattr(config.get("peft_type"), "value", config.get("peft_type")))
        config["task_type"] = str(getattr(config.get("task_type"), "value", config.get("task_type")))
        if base_model is not None:
            config["base_model_name_or_path"] = base_model
        with open(os.path.join(directory, "adapter_config.json"), "w") as f:
            json.dump(config, f, indent=2, default=str)

    def load_adapter(self, name: str, directory: str) -> None:
        """Load weights saved by :meth:`save_adapter` into the existing adapter ``name``."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        path = os.path.join(directory, ADAPTER_WEIGHTS)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no LoRA adapter at {path} (expected {ADAPTER_WEIGHTS})")
        device = self._params[name][0].device
        state = load_file(path, device=str(device))
        # peft annotates the result as a bare namedtuple: its fields are untyped
        result: Any = set_peft_model_state_dict(self.peft_model(), state, adapter_name=name)
        missing = [k for k in result.missing_keys if _is_adapter_param(k, name)]
        if result.unexpected_keys or missing:
            raise ValueError(
                f"adapter at {directory} does not fit adapter {name!r}: "
                f"missing {missing[:5]}, unexpected {list(result.unexpected_keys)[:5]} "
                "(was it saved with another lora_r / target modules / base model?)"
            )
        # Loading replaces tensors' data only; requires_grad and identity are kept.
        with torch.no_grad():
            for p in self._params[name]:
                p.requires_grad_(True)


def adapter_lora_settings(directory: str) -> dict[str, Any]:
    """The LoRA shape of a saved adapter (what ``add_adapter`` needs to hold its weights)."""
    with open(os.path.join(directory, "adapter_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    targets = config.get("target_modules")
    if isinstance(targets, str):  # peft also allows one regular expression
        raise ValueError(
            f"{directory}: target_modules is the pattern {targets!r}; a warm start needs a list of module names"
        )
    return {
        "r": int(config["r"]),
        "alpha": float(config.get("lora_alpha", config["r"])),
        "dropout": float(config.get("lora_dropout", 0.0)),
        "target_modules": sorted(targets) if targets else None,
    }


def merge_lora_adapter(model: nn.Module, directory: str) -> nn.Module:
    """``model`` with the LoRA adapter saved in ``directory`` merged into its weights
    (a plain transformers model again: no peft layers left)."""
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(model, directory, is_trainable=False)
    return cast(nn.Module, peft_model.merge_and_unload())
