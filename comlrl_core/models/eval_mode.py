"""A model in eval mode for one sampling call, switched only where a flag would change.

A sampling call runs the model in eval mode (no dropout) and puts the root's mode back at
the end. ``model.eval()`` / ``model.train(mode)`` are not free: ``nn.Module.train`` sets the
flag of every module through ``nn.Module.__setattr__``, and transformers (5.x with the
``kernels`` package installed, its default) adds hub-kernel bookkeeping to every call and
re-kernelizes the model when the mode changes. On a LoRA team's SmolLM2 (~3,100 modules;
AMD EPYC Zen 5, 2 CPUs) one ``train(False)`` took 9 ms when no flag changed and 25-28 ms on a
change; a call that switched to eval and back spent 18-55 ms on it, about a tenth of a
one-row prefill. Where every module is already in eval mode (evaluation, benchmarks,
a policy set to ``eval()`` by its user), nothing is switched; otherwise the model's own
``eval()`` and ``train(mode)`` run exactly as before. One case differs: a model whose flags
are all off but whose hub-kernel mode someone set to training by hand keeps that kernel
mode while it samples (``eval()`` would have switched it to inference kernels); the
results are the same, only the kernels chosen may be slower.

Public API::

    sampling_eval_mode(model, walk=None)  (context manager)
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from torch import nn

from comlrl_core.models.cpu.model_walk import ModelWalk


@contextlib.contextmanager
def sampling_eval_mode(model: nn.Module, walk: ModelWalk | None = None) -> Iterator[None]:
    """``model`` in eval mode inside the block; after it, ``model.train(mode)`` with the
    root's mode from before, as a plain ``eval()`` ... ``train(mode)`` pair would leave it.
    Neither runs when every module is in eval mode already (they would change nothing).
    ``walk``: the sampling call's walk of ``model`` (shared with the weight packing), if
    it has one."""
    was_training = model.training
    switch = any(module.training for module in (walk or ModelWalk(model)).modules)
    if switch:
        model.eval()
    try:
        yield
    finally:
        if switch:
            model.train(was_training)
