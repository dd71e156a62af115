"""Copy-free grouped-query attention (comlrl_core.models.cpu.gqa_attention) on the tiny model
(4 query heads, 2 key/value heads): same log-probs and gradients as stock ``sdpa``,
really without the head copies, and invisible in saved checkpoints."""

from __future__ import annotations

import json
import os

import pytest
import torch

from comlrl_core.models.cpu import gqa_attention
from comlrl_core.models.hf_policy import TransformersPolicy

PROMPTS = ["def add(a, b):", "Write a long story about a team of agents", "x"]


def _policies():
    torch.manual_seed(0)
    fast = TransformersPolicy.from_source("tiny-random", device="cpu")
    stock = TransformersPolicy.from_source("tiny-random", device="cpu")
    stock.model.config._attn_implementation = "sdpa"
    stock.model.load_state_dict(fast.model.state_dict())
    return fast, stock


def _score(policy):
    prompts = [policy.encode_prompt(p) for p in PROMPTS]
    completions = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    policy.model.zero_grad(set_to_none=True)
    lp, mask = policy.token_logprobs(prompts, completions)
    (lp.sum() / mask.sum()).backward()
    grads = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
    return lp.detach(), grads


def test_loaded_policies_use_the_copy_free_implementation():
    fast, stock = _policies()
    assert fast.model.config._attn_implementation == gqa_attention.IMPLEMENTATION
    assert stock.model.config._attn_implementation == "sdpa"


def test_same_logprobs_and_gradients_as_stock_sdpa():
    fast, stock = _policies()
    lp_fast, g_fast = _score(fast)
    lp_stock, g_stock = _score(stock)
    assert torch.allclose(lp_fast, lp_stock, atol=1e-5)
    assert g_fast.keys() == g_stock.keys() and len(g_fast) > 0
    for name in g_fast:
        assert torch.allclose(g_fast[name], g_stock[name], atol=1e-5, rtol=1e-4), name


def test_masked_passes_skip_the_head_copies(monkeypatch):
    fast, _ = _policies()
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, *args, **kwargs):
        seen.append((query.shape[1], key.shape[1], query.shape[2], kwargs.get("enable_gqa", False)))
        return real(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    _score(fast)
    multi_token = [s for s in seen if s[2] > 1]
    assert multi_token, "the scoring pass should attend with many query tokens"
    # 4 query heads against the 2 stored key/value heads, no expansion to 4
    assert all(q == 4 and k == 2 and gqa for q, k, _, gqa in multi_token)


def test_generation_matches_stock_sdpa():
    from comlrl_core.policy import GenerationConfig

    fast, stock = _policies()
    cfg = GenerationConfig(max_new_tokens=6, temperature=0.0)
    a = fast.generate(PROMPTS, num_samples=2, generation_config=cfg)
    b = stock.generate(PROMPTS, num_samples=2, generation_config=cfg)
    assert [[c.token_ids for c in row] for row in a] == [[c.token_ids for c in row] for row in b]


def test_checkpoints_do_not_record_the_private_implementation(tmp_path):
    fast, _ = _policies()
    fast.save(str(tmp_path))
    with open(os.path.join(tmp_path, "config.json")) as f:
        assert gqa_attention.IMPLEMENTATION not in f.read()
    again = TransformersPolicy.from_source(str(tmp_path), device="cpu")
    for (name, p), q in zip(fast.named_parameters(), again.parameters(), strict=True):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("implementation", ["eager"])
def test_other_implementations_are_left_alone(implementation):
    fast, _ = _policies()
    fast.model.config._attn_implementation = implementation
    assert gqa_attention.use_cpu_gqa_attention(fast.model) is False
    assert fast.model.config._attn_implementation == implementation
    assert json.dumps(fast.model.config.to_dict()).count(gqa_attention.IMPLEMENTATION) == 0


# -- the probe and the fallback ------------------------------------------------------------
FALLBACK_LOG = "copy-free GQA attention is off"


@pytest.fixture
def fresh_probe():
    """Each test sees its own probe result; the next tests probe this process again."""
    gqa_attention.unavailable_reason.cache_clear()
    yield
    gqa_attention.unavailable_reason.cache_clear()


def test_the_probe_passes_here_and_runs_once(fresh_probe, monkeypatch):
    calls = []
    real_probe = gqa_attention._probe
    monkeypatch.setattr(gqa_attention, "_probe", lambda: calls.append(1) or real_probe())
    _policies()
    _policies()
    assert gqa_attention.unavailable_reason() is None
    assert calls == [1]


def _sdpa_rejecting_masked_gqa(real):
    """scaled_dot_product_attention as in a torch whose kernels reject masked enable_gqa calls."""

    def fake(query, key, value, attn_mask=None, *args, enable_gqa=False, **kwargs):
        if enable_gqa and attn_mask is not None:
            raise RuntimeError("masked grouped-query attention is not supported")
        return real(query, key, value, attn_mask, *args, enable_gqa=enable_gqa, **kwargs)

    return fake


def _sdpa_with_wrong_gqa(real):
    """scaled_dot_product_attention whose grouped path silently returns other numbers."""

    def fake(query, key, value, *args, enable_gqa=False, **kwargs):
        out = real(query, key, value, *args, enable_gqa=enable_gqa, **kwargs)
        return out + 0.5 if enable_gqa and query.shape[1] != key.shape[1] else out

    return fake


@pytest.mark.parametrize(
    ("make_fake", "reason"),
    [(_sdpa_rejecting_masked_gqa, "RuntimeError: masked grouped-query"), (_sdpa_with_wrong_gqa, "results differ")],
)
def test_a_failing_probe_keeps_stock_sdpa_with_the_same_results(fresh_probe, monkeypatch, caplog, make_fake, reason):
    fast, _ = _policies()
    lp_fast, g_fast = _score(fast)
    monkeypatch.setattr(
        torch.nn.functional,
        "scaled_dot_product_attention",
        make_fake(torch.nn.functional.scaled_dot_product_attention),
    )
    gqa_attention.unavailable_reason.cache_clear()  # a new process with this torch
    with caplog.at_level("WARNING", logger=gqa_attention.__name__):
        fallback, _ = _policies()
    assert fallback.model.config._attn_implementation == "sdpa"
    messages = [r.getMessage() for r in caplog.records if FALLBACK_LOG in r.getMessage()]
    assert len(messages) == 1 and reason in messages[0]
    lp, grads = _score(fallback)  # runs through the faked kernel: the copy-free path is not used
    assert torch.allclose(lp, lp_fast, atol=1e-5)
    for name in g_fast:
        assert torch.allclose(grads[name], g_fast[name], atol=1e-5, rtol=1e-4), name


def test_transformers_without_the_registry_keeps_sdpa(fresh_probe, monkeypatch, caplog):
    import builtins

    real_import = builtins.__import__

    def no_registry(name, *args, **kwargs):
        if name == "transformers.masking_utils":
            raise ImportError("No module named 'transformers.masking_utils'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_registry)
    with caplog.at_level("WARNING", logger=gqa_attention.__name__):
        fallback, _ = _policies()
    assert fallback.model.config._attn_implementation == "sdpa"
    assert any("no attention registry" in r.getMessage() for r in caplog.records)


def test_the_probe_passes_when_a_model_loads_under_bf16_autocast(fresh_probe):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert gqa_attention.unavailable_reason() is None
