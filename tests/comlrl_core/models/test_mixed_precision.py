"""bf16 mixed precision: fp32 weights, gradients and optimizer state; bf16 compute.

Checked on the tiny model: the options validate, the matrix products really run in bf16
(seen by a hook), results stay close to fp32, gradients land in fp32 on every trainable
weight, a LoRA base is stored in bf16 with fp32 adapters, and the sampling helpers behave
as before (the preallocated KV cache gives the same tokens as the growing one; top-k
sampling only ever returns one of the k most likely tokens).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from comlrl_core.models import sampling
from comlrl_core.models.agent_spec import AgentSpec
from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.models.team import Team
from comlrl_core.policy import GenerationConfig

PROMPTS = ["def add(a, b):", "Write a story about a team", "x"]


def _pair():
    torch.manual_seed(0)
    exact = TransformersPolicy.from_source("tiny-random", device="cpu")
    mixed = TransformersPolicy.from_source("tiny-random", device="cpu", mixed_precision="bf16")
    mixed.model.load_state_dict(exact.model.state_dict())
    return exact, mixed


def _lm_head_dtypes(policy):
    seen = []
    head = policy.model.get_output_embeddings()
    handle = head.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    return seen, handle


def test_spec_validates_mixed_precision():
    with pytest.raises(ValueError, match="mixed_precision must be 'no' or 'bf16'"):
        AgentSpec("tiny-random", mixed_precision="fp16")
    with pytest.raises(ValueError, match="needs dtype='fp32'"):
        AgentSpec("tiny-random", mixed_precision="bf16", dtype="bf16")
    spec = AgentSpec("tiny-random", mixed_precision="BF16")
    assert spec.mixed_precision == "bf16" and spec.base_torch_dtype == torch.float32
    assert AgentSpec("tiny-random", lora=True, mixed_precision="bf16").base_torch_dtype == torch.bfloat16


def test_logprobs_run_in_bf16_close_to_fp32_with_fp32_gradients():
    exact, mixed = _pair()
    out = exact.generate(PROMPTS, 2, GenerationConfig(max_new_tokens=6), seed=3)
    prompts = [c.prompt_token_ids for g in out for c in g]
    comps = [c.token_ids for g in out for c in g]
    seen, handle = _lm_head_dtypes(mixed)
    lp_mixed, mask = mixed.token_logprobs(prompts, comps)
    handle.remove()
    assert seen == [torch.bfloat16]  # the products ran under bf16 autocast
    assert lp_mixed.dtype == torch.float32
    lp_exact, _ = exact.token_logprobs(prompts, comps)
    assert torch.allclose(lp_mixed, lp_exact, atol=0.1)
    assert not torch.equal(lp_mixed, lp_exact)  # it really is a different precision
    (lp_mixed * mask).sum().backward()
    (lp_exact * mask).sum().backward()
    for (name, p_m), p_e in zip(mixed.named_parameters(), exact.parameters(), strict=True):
        assert p_m.dtype == torch.float32 and p_m.grad is not None and p_m.grad.dtype == torch.float32, name
        cos = torch.nn.functional.cosine_similarity(p_m.grad.flatten(), p_e.grad.flatten(), dim=0)
        assert cos > 0.95, (name, float(cos))


def test_generation_runs_in_bf16_and_keeps_the_seed_contract():
    _, mixed = _pair()
    seen, handle = _lm_head_dtypes(mixed)
    cfg = GenerationConfig(max_new_tokens=5)
    a = mixed.generate(PROMPTS, 3, cfg, seed=9)
    handle.remove()
    assert seen and set(seen) == {torch.bfloat16}
    b = mixed.generate(PROMPTS, 3, cfg, seed=9)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())


def test_lora_under_mixed_precision_keeps_a_bf16_base_and_fp32_adapters():
    team = Team.from_specs(
        [
            AgentSpec("tiny-random", lora=True, mixed_precision="bf16", device="cpu"),
            AgentSpec("tiny-random", lora=True, mixed_precision="bf16", device="cpu"),
            AgentSpec("tiny-random", lora=True, device="cpu"),
        ]
    )
    a, b, c = team[0], team[1], team[2]
    assert a.shared_base is b.shared_base and a.shared_base is not c.shared_base
    frozen = [p for p in a.model.parameters() if not p.requires_grad]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    trainable = list(a.parameters())
    assert trainable and all(p.dtype == torch.float32 for p in trainable)
    out = a.generate(["hi"], 2, GenerationConfig(max_new_tokens=4), seed=0)
    lp, mask = a.token_logprobs([out[0][0].prompt_token_ids], [out[0][0].token_ids])
    (lp * mask).sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in trainable)


def test_preallocated_cache_gives_the_same_tokens_as_a_growing_one(monkeypatch):
    exact, mixed = _pair()
    cfg = GenerationConfig(max_new_tokens=9, temperature=0.8, top_k=20, top_p=0.9)
    for policy in (exact, mixed):
        reserved = policy.generate(PROMPTS, 3, cfg, seed=5)
        with monkeypatch.context() as m:
            m.setattr(sampling, "reserve_cache", lambda cache, extra: cache)
            grown = policy.generate(PROMPTS, 3, cfg, seed=5)
        assert [[c.token_ids for c in g] for g in reserved] == [[c.token_ids for c in g] for g in grown]


def test_reserved_cache_layers_write_in_place():
    policy, _ = _pair()
    ids = torch.tensor([policy.encode_prompt("hello there")])
    out = policy.model(input_ids=ids, use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    sampling.reserve_cache(cache, 4)
    layer = cache.layers[0]
    buffer = layer._key_buffer
    before = layer.keys.clone()
    step = policy.model(input_ids=ids[:, -1:], use_cache=True, **{sampling.cache_kwarg_name(policy.model): cache})
    assert cache.layers[0]._key_buffer is buffer  # no reallocation
    assert layer.keys.shape[-2] == ids.shape[1] + 1
    assert torch.equal(layer.keys[..., : ids.shape[1], :], before)
    assert step.logits.shape[1] == 1


@settings(max_examples=30, deadline=None)
@given(
    top_k=st.integers(1, 12), top_p=st.floats(0.05, 1.0), temperature=st.floats(0.1, 2.0), seed=st.integers(0, 10_000)
)
def test_top_k_sampling_draws_only_from_the_filtered_candidates(top_k, top_p, temperature, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(5, 40, generator=gen) * 3
    allowed = torch.isfinite(sampling.filter_logits(logits, temperature, top_k, top_p))
    draws = sampling.sample_next_tokens(logits, temperature, top_k, top_p, gen)
    assert draws.shape == (5,)
    assert allowed.gather(-1, draws[:, None]).all()
    assert torch.equal(sampling.sample_next_tokens(logits, 0.0, top_k, top_p, gen), logits.argmax(-1))


def test_top_k_sampling_matches_the_filtered_distribution():
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, -1.0, -3.0]])
    probs = sampling.filter_logits(logits, 0.7, 3, 0.95).softmax(-1)[0]
    draws = sampling.sample_next_tokens(logits.expand(20_000, -1), 0.7, 3, 0.95, gen)
    freq = torch.bincount(draws, minlength=6).float() / draws.numel()
    assert torch.allclose(freq, probs, atol=0.015)
