"""AgentSpec: how to build one transformers agent (model source, LoRA, dtype, device).

Public API::

    AgentSpec(model, lora=False, lora_r=8, lora_alpha=16, lora_dropout=0.0,
              lora_target_modules=None, dtype="fp32", mixed_precision="no", device="auto",
              gradient_checkpointing=False, use_chat_template=True,
              system_prompt=None, share_base=True, name=None)
    AgentSpec.torch_dtype -> torch.dtype ; AgentSpec.base_torch_dtype -> torch.dtype
    AgentSpec.resolved_device() -> str
    resolve_device(device: str) -> str   ("auto" -> "cuda:0" when CUDA is present, else "cpu")

Re-exported by ``comlrl_core.models.team``. Validation happens in ``__post_init__``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_MIXED = ("no", "bf16")
_DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16"}


def resolve_device(device: str) -> str:
    """Canonical device string: ``auto`` picks CUDA when present, else CPU."""
    import torch

    if device == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but CUDA is not available; use device='auto' or 'cpu'")
        index = 0 if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise ValueError(f"device={device!r} but only {torch.cuda.device_count()} CUDA device(s) exist")
        return f"cuda:{index}"
    return str(dev)


@dataclass
class AgentSpec:
    """One transformers agent.

    ``model``: hub id, local folder, .gguf file or alias (see ``comlrl_core.models.model_source``).
    ``lora``: train a LoRA adapter (the base stays frozen) instead of all weights.
    ``lora_target_modules``: None finds every Linear layer in the decoder blocks.
    ``dtype``: the weights' dtype. ``mixed_precision="bf16"`` keeps fp32 weights (and so
    fp32 gradients and optimizer state) but runs forward passes under bf16 autocast:
    the matrix products run in bf16 (on CPUs with AMX several times faster than fp32,
    on GPUs the usual choice; on CPUs without bf16 hardware several times SLOWER, so such
    a spec warns there, see ``comlrl_core.models.precision``). With ``lora=True`` the
    frozen base is then stored in bf16 and the adapters stay fp32 (see ``base_torch_dtype``).
    ``share_base``: LoRA agents with the same model, dtype and device share one base copy.
    ``use_chat_template``: wrap prompts in the tokenizer's chat template when it has one.
    """

    model: str
    lora: bool = False
    lora_r: int = 8
    lora_alpha: float = 16
    lora_dropout: float = 0.0
    lora_target_modules: list[str] | None = None
    dtype: str = "fp32"
    mixed_precision: str = "no"
    device: str = "auto"
    gradient_checkpointing: bool = False
    use_chat_template: bool = True
    system_prompt: str | None = None
    share_base: bool = True
    name: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.model, os.PathLike):
            self.model = os.fspath(self.model)
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"AgentSpec.model must be a hub id, folder, .gguf path or alias, got {self.model!r}")
        for flag in ("lora", "gradient_checkpointing", "use_chat_template", "share_base"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"AgentSpec.{flag} must be True or False, got {getattr(self, flag)!r}")
        if isinstance(self.lora_r, bool) or not isinstance(self.lora_r, int) or self.lora_r < 1:
            raise ValueError(f"AgentSpec.lora_r must be an int >= 1 (e.g. 8), got {self.lora_r!r}")
        if not isinstance(self.lora_alpha, (int, float)) or self.lora_alpha <= 0:
            raise ValueError(f"AgentSpec.lora_alpha must be > 0 (e.g. 2 * lora_r), got {self.lora_alpha!r}")
        if not isinstance(self.lora_dropout, (int, float)) or not 0 <= self.lora_dropout < 1:
            raise ValueError(f"AgentSpec.lora_dropout must be in [0, 1), got {self.lora_dropout!r}")
        if self.lora_target_modules is not None:
            if isinstance(self.lora_target_modules, str):
                self.lora_target_modules = [self.lora_target_modules]
            mods = list(self.lora_target_modules)
            if not mods or not all(isinstance(m, str) and m for m in mods):
                raise ValueError(
                    "AgentSpec.lora_target_modules must be None (auto) or a non-empty list of "
                    f"module names such as ['q_proj', 'v_proj'], got {self.lora_target_modules!r}"
                )
            self.lora_target_modules = mods
        if not isinstance(self.dtype, str) or self.dtype.lower() not in _DTYPES:
            raise ValueError(f"AgentSpec.dtype must be 'fp32' or 'bf16', got {self.dtype!r}")
        self.dtype = "bf16" if _DTYPES[self.dtype.lower()] == "bfloat16" else "fp32"
        if not isinstance(self.mixed_precision, str) or self.mixed_precision.lower() not in _MIXED:
            raise ValueError(f"AgentSpec.mixed_precision must be 'no' or 'bf16', got {self.mixed_precision!r}")
        self.mixed_precision = self.mixed_precision.lower()
        if self.mixed_precision != "no" and self.dtype != "fp32":
            raise ValueError(
                f"AgentSpec.mixed_precision={self.mixed_precision!r} keeps fp32 master weights and "
                f"needs dtype='fp32', got dtype={self.dtype!r}; use one or the other"
            )
        if not isinstance(self.device, str):
            self.device = str(self.device)
        if self.device != "auto":
            try:
                import torch

                torch.device(self.device)
            except (RuntimeError, TypeError) as exc:
                raise ValueError(
                    f"AgentSpec.device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {self.device!r}"
                ) from exc
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            raise ValueError(f"AgentSpec.system_prompt must be a string or None, got {self.system_prompt!r}")
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ValueError(f"AgentSpec.name must be a non-empty string or None, got {self.name!r}")
        if self.mixed_precision == "bf16":
            # bf16 autocast on hardware without bf16 products is a slowdown (issue 15): say so
            from comlrl_core.models.precision import warn_if_bf16_is_slow

            warn_if_bf16_is_slow(self.device, stacklevel=3)  # the code that built the spec

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, _DTYPES[self.dtype])

    @property
    def base_torch_dtype(self):
        """The dtype the model weights are loaded in. Under bf16 mixed precision a frozen
        LoRA base is stored in bf16 (it needs no fp32 master copy, and autocast would
        re-cast fp32 frozen weights on every pass); trainable weights stay ``torch_dtype``."""
        import torch

        if self.lora and self.mixed_precision == "bf16":
            return torch.bfloat16
        return self.torch_dtype

    def resolved_device(self) -> str:
        return resolve_device(self.device)
