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
Models on other attention implementations (eager, flash, a user's own) are left alone,
and transformers versions without the attention registry keep plain ``sdpa``.
"""

from __future__ import annotations

import torch

IMPLEMENTATION = "comlrl_sdpa_gqa"
_stock_sdpa = None  # transformers' sdpa_attention_forward, bound by _register


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
        return _stock_sdpa(
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


def _register() -> bool:
    global _stock_sdpa
    try:
        from transformers import AttentionInterface
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:  # transformers without the attention registry
        return False
    _stock_sdpa = sdpa_attention_forward
    if IMPLEMENTATION not in AttentionInterface._global_mapping:
        AttentionInterface.register(IMPLEMENTATION, _gqa_sdpa_forward)
    if IMPLEMENTATION not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    return True


def use_cpu_gqa_attention(model: torch.nn.Module) -> bool:
    """Switch ``model`` (and every sub-config on ``sdpa``) to the copy-free GQA attention;
    return whether it was switched. Only ``sdpa`` models with grouped heads change."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if not heads or not kv_heads or heads == kv_heads:
        return False
    if not _register():
        return False
    config._attn_implementation = IMPLEMENTATION
    return config._attn_implementation == IMPLEMENTATION
