"""Grouped-query attention without head copies for masked multi-token passes on CPU.

transformers' ``sdpa`` attention expands the key/value heads to the query heads
(``repeat_kv``: a copy of every key and value, and in training a reduction of their
gradients) whenever an attention mask is passed, because on CUDA a masked
``enable_gqa=True`` call falls back to the slow math kernel. On CPU the flash kernel
takes masked grouped-query attention directly, so for scoring passes (many query tokens,
a padding mask, a KV cache expanded to G completions) the copies are pure overhead:
about a tenth of a SmolLM2-135M update step on 2 cores.

:func:`use_cpu_gqa_attention` switches a loaded model from ``sdpa`` to the registered
``"comlrl_sdpa_gqa"`` implementation, which is ``sdpa`` everywhere except on CPU passes
with more than one query token and grouped heads, where it calls
``scaled_dot_product_attention(..., enable_gqa=True)``. Results are the same to rounding.
Models on other attention implementations (eager, flash, a user's own) are left alone.

The path leans on private ground (transformers' attention registry and its stock ``sdpa``
function, torch's ``enable_gqa``, torch >= 2.5), so the first model to qualify runs a
probe: a small masked and an unmasked grouped call through this path and through stock
``sdpa``. If anything raises or the results differ, the process keeps plain ``sdpa`` and
logs one warning saying why.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import torch

IMPLEMENTATION = "comlrl_sdpa_gqa"
logger = logging.getLogger(__name__)
_stock_sdpa: Callable[..., Any] | None = None  # transformers' sdpa_attention_forward, bound by _register


def _gqa_sdpa_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    groups = getattr(module, "num_key_value_groups", 1)
    q_length = query.shape[2]
    plain = (
        query.device.type != "cpu"
        or groups <= 1
        or q_length == 1
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
        or kwargs.get("output_attentions", False)
        or torch.jit.is_tracing()
    )
    if plain:
        return _stock()(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    is_causal = bool(is_causal) and attention_mask is None
    if is_causal and key.shape[2] > q_length:  # unmasked prefill into an empty static cache
        key, value = key[:, :, :q_length, :], value[:, :, :q_length, :]
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=is_causal,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def _stock() -> Callable[..., Any]:
    if _stock_sdpa is None:
        raise RuntimeError(f"{IMPLEMENTATION} is used before it was registered with transformers")
    return _stock_sdpa


def _register() -> str | None:
    """Register the implementation with transformers; None on success, else the reason."""
    global _stock_sdpa
    try:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as exc:  # transformers without the attention registry
        return f"this transformers has no attention registry ({exc})"
    _stock_sdpa = sdpa_attention_forward
    if IMPLEMENTATION not in AttentionInterface._global_mapping:
        AttentionInterface.register(IMPLEMENTATION, _gqa_sdpa_forward)
    if IMPLEMENTATION not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    return None


def _probe() -> str | None:
    """Run this path and stock ``sdpa`` on a small grouped call (4 query heads on 2
    key/value heads, 5 tokens), masked and unmasked; None when they agree, else why not."""
    module: Any = torch.nn.Module()  # a stand-in attention module: only these two attributes are read
    module.num_key_value_groups, module.is_causal = 2, True
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2, 4, 5, 8, generator=gen)
    key, value = torch.randn(2, 2, 5, 8, generator=gen), torch.randn(2, 2, 5, 8, generator=gen)
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    mask[0, :, 2:, 0] = False  # a padded key in one row; every query keeps its own position
    for attention_mask in (mask, None):
        ours, _ = _gqa_sdpa_forward(module, query, key, value, attention_mask)
        stock, _ = _stock()(module, query, key, value, attention_mask)
        if ours.shape != stock.shape:
            return f"output shape {tuple(ours.shape)} differs from sdpa's {tuple(stock.shape)}"
        if not torch.allclose(ours, stock, atol=1e-5, rtol=1e-4):
            gap = (ours - stock).abs().max().item()
            return f"results differ from sdpa by up to {gap:.3g}"
    return None


@functools.cache
def unavailable_reason() -> str | None:
    """None when the copy-free path works in this process, else why not (checked once,
    logged once)."""
    try:
        with torch.autocast("cpu", enabled=False):  # compare in fp32, whatever region a model loads in
            reason = _register() or _probe()
    except Exception as exc:  # noqa: BLE001 - any failure means: keep the plain path
        reason = f"{type(exc).__name__}: {exc}"
    if reason is not None:
        logger.warning("copy-free GQA attention is off, models keep transformers' sdpa: %s", reason)
    return reason


def use_cpu_gqa_attention(model: torch.nn.Module) -> bool:
    """Switch ``model`` (and every sub-config on ``sdpa``) to the copy-free GQA attention;
    return whether it was switched. Only ``sdpa`` models with grouped heads change, and
    only where the probe (:func:`unavailable_reason`) passed."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if not heads or not kv_heads or heads == kv_heads:
        return False
    if unavailable_reason() is not None:
        return False
    config._attn_implementation = IMPLEMENTATION
    return config._attn_implementation == IMPLEMENTATION
