"""A model in eval mode for one sampling call, at the cost of its flags only.

A sampling call runs the model in eval mode (no dropout) and puts the modes back at the
end. ``model.eval()`` / ``model.train(mode)`` are not free: ``nn.Module.train`` sets the
flag of every module through ``nn.Module.__setattr__`` (~3,100 modules on a LoRA team), and
transformers (5.x with the ``kernels`` package installed, which turns hub kernels on by
default) adds hub-kernel bookkeeping to every call and re-kernelizes the whole model when
the mode changes. Measured on a LoRA team's SmolLM2 (AMD EPYC Zen 4, 2 CPUs, medians of 15):
``eval()`` and ``train()`` together 48.8 ms with hub kernels on, 17.1 ms with them off, and
0.36 ms setting the flags directly; a one-row prefill takes ~500 ms.

Two measures:

- :func:`without_idle_hub_kernels`: a model loaded onto the CPU gets hub kernels turned off
  (``use_kernels = False``). transformers' kernel mapping names no CPU kernel, so the
  kernelization selects the modules' own forwards in either mode and only costs time; on
  other devices the setting is left alone (hub kernels there replace layers).
- :func:`sampling_eval_mode`: where every module's ``train`` only sets its flag
  (``nn.Module.train``, or transformers' override on a model without hub kernels), the
  flags (plain instance attributes, as ``nn.Module.__init__`` makes them) are set directly
  and each module gets ITS OWN flag back afterwards (a submodule a user froze in eval mode
  stays so). Where some module overrides ``train`` otherwise, the
  model's own ``eval()`` and ``train(root's mode)`` run, as a plain pair would. Where every
  module is in eval mode already, nothing is switched.

Public API::

    without_idle_hub_kernels(model) -> whether hub kernels were turned off
    sampling_eval_mode(model, walk=None)  (context manager)
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

from torch import nn

from comlrl_core.models.cpu.model_walk import ModelWalk

# the qualified name of transformers' PreTrainedModel.train (named, not imported: this
# module works on any nn.Module)
_TRANSFORMERS_TRAIN = ("transformers.modeling_utils", "PreTrainedModel.train")


def _is_transformers_train(method: object) -> bool:
    return (getattr(method, "__module__", None), getattr(method, "__qualname__", None)) == _TRANSFORMERS_TRAIN


def without_idle_hub_kernels(model: nn.Module) -> bool:
    """Turn hub kernels off for a transformers model whose weights sit on the CPU and that
    was given no kernel config of its own; returns whether they were on. transformers'
    kernel mapping has no CPU entries, so this changes no layer, only what a mode switch
    costs. Other models and devices are left as they are."""
    if not getattr(model, "use_kernels", False) or getattr(model, "kernel_config", None) is not None:
        return False
    weight = next(model.parameters(), None)
    if weight is None or weight.device.type != "cpu":
        return False
    transformers_model: Any = model  # a PreTrainedModel: use_kernels is its property
    transformers_model.use_kernels = False  # transformers resets the kernelization: the torch forwards
    return True


def _flags_only(modules: Sequence[nn.Module]) -> bool:
    """Whether every module's ``train`` does nothing but set its flags (``nn.Module.train``,
    or transformers' override on a model without hub kernels, which then only calls it)
    and every flag is the plain instance attribute ``nn.Module.__init__`` made."""
    for module in modules:
        if "training" not in module.__dict__:  # the flag lives elsewhere (a property): not ours to set
            return False
        method = type(module).train
        if method is nn.Module.train:
            continue
        if _is_transformers_train(method) and not getattr(module, "use_kernels", False):
            continue
        return False
    return True


@contextlib.contextmanager
def sampling_eval_mode(model: nn.Module, walk: ModelWalk | None = None) -> Iterator[None]:
    """``model`` in eval mode inside the block. After it, each module's own flag comes back
    when the flags could be set directly; else ``model.train(mode)`` runs with the root's
    mode from before. Nothing is switched when every module is in eval mode already.
    ``walk``: the sampling call's walk of ``model`` (shared with the weight packing), if
    it has one."""
    modules = (walk or ModelWalk(model)).modules
    flags = [module.training for module in modules]
    if not any(flags):
        yield
        return
    if _flags_only(modules):
        for module in modules:
            module.__dict__["training"] = False  # what nn.Module.train stores, minus __setattr__
        try:
            yield
        finally:
            for module, flag in zip(modules, flags, strict=True):
                module.__dict__["training"] = flag
        return
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
