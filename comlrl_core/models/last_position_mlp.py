"""The last decoder layer's MLP on the last position only, in prompt passes whose only
readers are the cache and the last position's logits.

A sampling call's prompt pass needs two things from the model: every layer's keys and
values (they become the decoding cache) and the logits at each row's last position. In a
Llama-family decoder layer the keys and values come out of the attention, before the MLP,
and everything after the MLP (the residual add, the final norm, the vocabulary projection)
works position by position. So the last layer's MLP output at the earlier positions feeds
nothing that is read: no later layer, no cache, no kept logit. transformers' ``generate``
computes it anyway. :func:`last_position_mlp` makes that MLP run on each row's last
position only; the layer's residual add broadcasts the one position over the others, whose
hidden states are then not the model's (nobody reads them). The last position's values are
the same computation on fewer rows (equal up to the GEMM's summation order).

What it saves: the MLP holds three of a layer's four big products (SmolLM2-135M: 2.65M of
3.54M weights a layer), so one of 30 layers' MLP is ~2.5% of a prompt pass's products, and
the same share of the pass's activations of that layer.

Where it applies: the sampler's passes (:func:`comlrl_core.models.sampling.sample_tokens`
reads only the cache and the last logits). Only for decoder layers known to use the MLP's
output position by position (``SUPPORTED_LAYERS``), not when the model is asked for hidden
states, not on passes with gradients, one position, or an MLP that carries hooks or a
replaced ``forward`` (someone else's wrapper expects the full shape; our own lean SwiGLU
forward, :mod:`comlrl_core.models.swiglu`, is position-wise and gets wrapped).

Public API::

    last_position_mlp(model) -> context manager yielding whether the MLP was switched
    last_layer_mlp(model) -> the MLP module it would switch, or None
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn

from comlrl_core.models.cpu.packed_linear import prompt_pass
from comlrl_core.models.lora import transformers_model
from comlrl_core.models.swiglu import has_lean_swiglu

# decoder layers that compute ``residual + mlp(post_attention_layernorm(h))`` with the keys
# and values taken before the MLP (each checked by tests/comlrl_core/models/test_last_position_mlp.py)
SUPPORTED_LAYERS = frozenset({"LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"})


class _LastPositionForward:
    """Replacement ``forward`` of the last layer's MLP: a no-grad pass of several positions
    runs on the last one (``[B, 1, D]``, broadcast by the layer's residual add)."""

    def __init__(self, mlp: nn.Module) -> None:
        self.original = mlp.forward

    def __call__(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if hidden_states.dim() == 3 and hidden_states.shape[1] > 1 and not torch.is_grad_enabled():
            with prompt_pass():  # one position per row, but a prompt pass: packed layers stay unpacked
                return self.original(hidden_states[:, -1:, :], *args, **kwargs)
        return self.original(hidden_states, *args, **kwargs)


def last_layer_mlp(model: nn.Module) -> nn.Module | None:
    """The MLP of ``model``'s last decoder layer when :func:`last_position_mlp` can switch it
    (a supported layer, no hidden states asked for, no hooks or wrapper on it), else None."""
    base = transformers_model(model)
    config = getattr(base, "config", None)
    if config is None or getattr(config, "output_hidden_states", False):
        return None
    get_decoder = getattr(base, "get_decoder", None)
    layers = getattr(get_decoder(), "layers", None) if callable(get_decoder) else None
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        return None
    layer = layers[-1]
    mlp = getattr(layer, "mlp", None)
    if type(layer).__name__ not in SUPPORTED_LAYERS or not isinstance(mlp, nn.Module):
        return None
    if ("forward" in mlp.__dict__ and not has_lean_swiglu(mlp)) or mlp._forward_hooks or mlp._forward_pre_hooks:
        return None
    return mlp


@contextlib.contextmanager
def last_position_mlp(model: nn.Module) -> Iterator[bool]:
    """Within the block, no-grad passes of several positions run ``model``'s last decoder
    layer's MLP on the last position only (see the module docstring): for callers that read
    nothing but the cache and the last position's logits. Yields whether the MLP was
    switched; its own ``forward`` comes back on exit."""
    mlp = last_layer_mlp(model)
    if mlp is None:
        yield False
        return
    own = mlp.__dict__.get("forward")  # our lean SwiGLU forward, or None (the class's)
    mlp.__dict__["forward"] = _LastPositionForward(mlp)
    try:
        yield True
    finally:
        if own is None:
            mlp.__dict__.pop("forward", None)
        else:
            mlp.__dict__["forward"] = own
