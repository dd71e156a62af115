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
    for (name, p), q in zip(fast.named_parameters(), again.parameters()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("implementation", ["eager"])
def test_other_implementations_are_left_alone(implementation):
    fast, _ = _policies()
    fast.model.config._attn_implementation = implementation
    assert gqa_attention.use_cpu_gqa_attention(fast.model) is False
    assert fast.model.config._attn_implementation == implementation
    assert json.dumps(fast.model.config.to_dict()).count(gqa_attention.IMPLEMENTATION) == 0
