"""Sibling layers that read one input share one stacked oneDNN weight
(comlrl_core.models.cpu.sibling_linears, used by comlrl_core.models.cpu.packed_linear)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from onednn_marks import needs_onednn
from torch import nn

from comlrl_core.models.cpu import fp32_layout, packed_linear
from comlrl_core.models.cpu.sibling_linears import FusedSiblings, sibling_groups
from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.models.joint_generation import GenerationRequest, generate_together
from comlrl_core.policy import GenerationConfig


@pytest.fixture(autouse=True)
def forced_onednn(monkeypatch):
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")


def _policy() -> TransformersPolicy:
    torch.manual_seed(0)
    return TransformersPolicy.from_source("tiny-random", device="cpu")


def _siblings(sizes: list[int], width: int = 64, bias: bool = False, seed: int = 0) -> list[nn.Linear]:
    torch.manual_seed(seed)
    return [nn.Linear(width, size, bias=bias) for size in sizes]


def _same_in_every_route(monkeypatch, sample):
    """``sample()`` (stacked, oneDNN) gives the same tokens with stacking off, then on MKL."""
    stacked = sample()
    monkeypatch.setattr(packed_linear, "FUSE_SIBLINGS", False)
    assert sample() == stacked
    monkeypatch.setenv(fp32_layout.ENV_VAR, "mkl")
    assert sample() == stacked
    return stacked


# ---------------------------------------------------------------------- which layers
def test_llama_attention_and_mlp_siblings_are_grouped():
    model = _policy().model
    groups = sibling_groups(model, lambda m: True)
    expected = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        expected += [[attn.q_proj, attn.k_proj, attn.v_proj], [mlp.gate_proj, mlp.up_proj]]
    assert [[id(m) for m in g] for g in groups] == [[id(m) for m in g] for g in expected]
    assert sibling_groups(model, lambda m: m.out_features != 32) == [g for g in expected if len(g) == 2]


def test_lora_wrapped_siblings_group_their_base_layers(lora_team):
    model = lora_team[0].model
    groups = sibling_groups(model, lambda m: True)
    attn = model.get_base_model().model.layers[0].self_attn
    bases = [attn.q_proj.base_layer, attn.k_proj.base_layer, attn.v_proj.base_layer]
    assert [id(m) for m in groups[0]] == [id(m) for m in bases]
    assert all(type(m) is nn.Linear for g in groups for m in g)


def test_unknown_parents_and_tied_weights_are_not_fused():
    class CustomAttention(nn.Module):  # not a class whose call pattern is known
        def __init__(self) -> None:
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = _siblings([64, 64, 64])

    assert sibling_groups(CustomAttention(), lambda m: True) == []
    model = _policy().model
    mlp = model.model.layers[0].mlp
    assert len(packed_linear.onednn_units(model)[0]) == 4
    mlp.up_proj.weight = mlp.gate_proj.weight  # a weight held by two modules stays unfused
    groups, singles = packed_linear.onednn_units(model)
    assert len(groups) == 3 and mlp.gate_proj in singles and mlp.up_proj in singles


def test_fusion_can_be_switched_off(monkeypatch):
    model = _policy().model
    monkeypatch.setattr(packed_linear, "FUSE_SIBLINGS", False)
    groups, singles = packed_linear.onednn_units(model)
    assert groups == [] and all(packed_linear._packable(m, packed_linear.FP32_ONEDNN) for m in singles)


# ---------------------------------------------------------------------- the stacked product
@needs_onednn
def test_one_stacked_product_serves_every_sibling(monkeypatch, record_onednn_rows):
    layers = _siblings([64, 32, 32], bias=True)
    plain = [(layer.weight.detach().clone(), layer.bias.detach().clone()) for layer in layers]
    calls = record_onednn_rows()
    fused = FusedSiblings(layers, rows=4)
    x = torch.randn(4, 64)
    with torch.no_grad():
        outs = [fused.output(i, x, decoding=True) for i in range(3)]
        assert calls == [4]  # one product for the three
        assert all(layer.weight.numel() == 0 for layer in layers)  # the stacked copy is the only one
        for out, (w, b) in zip(outs, plain, strict=True):
            assert torch.allclose(out, F.linear(x, w, b), atol=1e-5)
        fused.output(1, x, decoding=True)  # the same sibling again: its first result may be changed
        assert calls == [4, 4]
        x.add_(1.0)  # the same tensor, changed in place
        assert torch.allclose(fused.output(0, x, decoding=True), F.linear(x, *plain[0]), atol=1e-5)
        assert len(calls) == 3
        other = torch.randn(4, 64)
        assert torch.allclose(fused.output(2, other, decoding=True), F.linear(other, *plain[2]), atol=1e-5)
        assert len(calls) == 4
    fused.restore()
    assert all(torch.equal(layer.weight, w) for layer, (w, _) in zip(layers, plain, strict=True))
    assert all(layer.weight.is_contiguous() for layer in layers)


@needs_onednn
@settings(max_examples=20, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([16, 48, 64, 96]), min_size=2, max_size=3),
    rows=st.integers(1, 20),
    order=st.permutations([0, 1, 2]),
    bias=st.booleans(),
)
def test_any_call_order_gives_each_sibling_its_own_product(sizes, rows, order, bias):
    layers = _siblings(sizes, bias=bias, seed=rows)
    expected_weights = [
        (layer.weight.detach().clone(), None if layer.bias is None else layer.bias.detach()) for layer in layers
    ]
    fused = FusedSiblings(layers, rows=rows)
    x = torch.randn(rows, 64)
    with torch.no_grad():
        for i in [i for i in order if i < len(sizes)]:
            out = fused.output(i, x, decoding=True)
            assert out.shape == (rows, sizes[i])
            assert torch.allclose(out, F.linear(x, *expected_weights[i]), atol=1e-5)
    fused.restore()
    assert all(torch.equal(layer.weight, w) for layer, (w, _) in zip(layers, expected_weights, strict=True))


@needs_onednn
def test_a_prefill_after_the_packing_gets_contiguous_columns_on_the_released_weights(monkeypatch, record_onednn_rows):
    layers = _siblings([64, 32, 32])
    plain = [layer.weight.detach().clone() for layer in layers]
    calls = record_onednn_rows()
    fused = FusedSiblings(layers, rows=2)
    with torch.no_grad():
        fused.output(0, torch.randn(2, 64), decoding=True)  # packs
        prompt = torch.randn(2, 7, 64)
        outs = [fused.output(i, prompt, decoding=False) for i in range(3)]
    assert calls == [2]  # the prefill pass ran on the plain stacked weight, not oneDNN's kernel
    assert all(out.is_contiguous() and out.shape == (2, 7, w.shape[0]) for out, w in zip(outs, plain, strict=True))
    assert all(torch.allclose(out, F.linear(prompt, w), atol=1e-5) for out, w in zip(outs, plain, strict=True))
    assert all(layer.weight.numel() == 0 for layer in layers)  # still released


# ---------------------------------------------------------------------- inside a model
@needs_onednn
def test_a_decoding_pass_runs_one_product_per_set_of_siblings(monkeypatch, record_onednn_rows):
    policy = _policy()
    model = policy.model
    groups, singles = packed_linear.onednn_units(model)
    ids = torch.randint(5, 100, (6, 1))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        calls = record_onednn_rows()
        with packed_linear.prepacked_linears(model, rows=6, new_tokens=8):
            logits = model(input_ids=ids).logits
            assert len(calls) == len(groups) + len(singles)  # 5 layers' products in 2 + 3 per layer
            attn = model.model.layers[0].self_attn
            assert attn.q_proj.weight.numel() == 0 and attn.k_proj.weight.numel() == 0
    assert torch.allclose(logits, expected, atol=1e-4)


@needs_onednn
def test_a_pass_with_gradients_gets_every_sibling_back():
    policy = _policy()
    model = policy.model
    attn = model.model.layers[0].self_attn
    saved = {name: getattr(attn, name).weight.detach().clone() for name in ("q_proj", "k_proj", "v_proj")}
    hidden = torch.randn(3, 64)
    with packed_linear.prepacked_linears(model, rows=3, new_tokens=8):
        with torch.no_grad():
            attn.q_proj(hidden), attn.k_proj(hidden), attn.v_proj(hidden)  # packs the three
        assert all(getattr(attn, name).weight.numel() == 0 for name in saved)
        attn.k_proj(hidden).sum().backward()  # gradients on: the plain layer, and its siblings back too
        assert all(torch.equal(getattr(attn, name).weight.detach(), w) for name, w in saved.items())
        assert attn.k_proj.weight.grad is not None
    assert all(torch.equal(getattr(attn, name).weight.detach(), w) for name, w in saved.items())
    assert not any("forward" in getattr(attn, name).__dict__ for name in saved)


@needs_onednn
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_samples_are_the_same_fused_or_not(monkeypatch, temperature):
    policy = _policy()
    cfg = GenerationConfig(max_new_tokens=8, temperature=temperature)
    prompts = ["def add(a, b):", "Write a story about a team", "x"]
    _same_in_every_route(
        monkeypatch, lambda: [[c.token_ids for c in g] for g in policy.generate(prompts, 2, cfg, seed=3)]
    )


@needs_onednn
def test_lora_agents_sampled_together_are_the_same_fused_or_not(lora_team, monkeypatch, record_onednn_rows):
    """Adapters of two agents in one batch on fused base layers (the lean step adds each
    row's low-rank update to the sibling's columns in place)."""
    cfg = GenerationConfig(max_new_tokens=8, temperature=1.0, top_k=20)
    requests = [
        GenerationRequest(["hello there", "a much longer prompt about many things"], 2, cfg, list(range(11, 15))),
        GenerationRequest(["x", "yy zz"], 2, cfg, list(range(21, 25))),
    ]
    ids = lambda results: [[[c.token_ids for c in g] for g in agent] for agent in results]  # noqa: E731
    assert packed_linear.onednn_units(lora_team[0].model)[0]  # base layers to stack
    calls = record_onednn_rows()
    products_per_call: list[int] = []

    def sample():
        samples = ids(generate_together(list(lora_team), requests))
        products_per_call.append(len(calls))
        return samples

    _same_in_every_route(monkeypatch, sample)
    assert products_per_call[0] > 0  # the first, stacked call ran on oneDNN


@needs_onednn
def test_lora_on_some_siblings_only_fuses_the_base_layers_with_the_same_samples(monkeypatch):
    """LoRA on q and v only: k stays a plain linear, q and v are wrappers; the three base
    layers share one stacked weight, and each wrapper adds its update to its own columns."""
    from comlrl_core.models.team import AgentSpec, Team

    torch.manual_seed(0)
    policy = Team.from_specs([AgentSpec(model="tiny-random", lora=True, lora_target_modules=["q_proj", "v_proj"])])[0]
    for name, weight in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(weight, std=0.5)
    attn = policy.model.get_base_model().model.layers[0].self_attn
    groups, _ = packed_linear.onednn_units(policy.model)
    assert [id(m) for m in groups[0]] == [id(attn.q_proj.base_layer), id(attn.k_proj), id(attn.v_proj.base_layer)]
    cfg = GenerationConfig(max_new_tokens=8, temperature=1.0)
    prompts = ["def add(a, b):", "Write a story about a team"]
    _same_in_every_route(
        monkeypatch, lambda: [[c.token_ids for c in g] for g in policy.generate(prompts, 3, cfg, seed=5)]
    )


@needs_onednn
def test_sampling_under_inference_mode_keeps_the_stacked_weights_on(monkeypatch, record_onednn_rows):
    """Tensors made under ``torch.inference_mode`` keep no version counter: the stacked
    product must not depend on one (reading it raised, and switched oneDNN off)."""
    policy = _policy()
    cfg = GenerationConfig(max_new_tokens=8, temperature=0.0)
    prompts = ["def add(a, b):", "x y"]
    expected = [[c.token_ids for c in g] for g in policy.generate(prompts, 2, cfg, seed=1)]
    calls = record_onednn_rows()
    with torch.inference_mode():
        samples = [[c.token_ids for c in g] for g in policy.generate(prompts, 2, cfg, seed=1)]
    assert samples == expected
    assert packed_linear.FP32_ONEDNN not in packed_linear._broken
    groups, singles = packed_linear.onednn_units(policy.model)
    assert len(calls) >= 7 * (len(groups) + len(singles))  # every decoding step on the stacked weights


@needs_onednn
def test_an_inference_tensor_input_is_served_once_per_sibling(monkeypatch, record_onednn_rows):
    layers = _siblings([64, 32])
    calls = record_onednn_rows()
    fused = FusedSiblings(layers, rows=2)
    with torch.inference_mode():
        x = torch.randn(2, 64)
        fused.output(0, x, decoding=True), fused.output(1, x, decoding=True)
        assert len(calls) == 1
        fused.output(0, x, decoding=True)  # served already: computed afresh
        assert len(calls) == 2
    fused.restore()


@needs_onednn
def test_operands_give_each_layer_its_packed_weight_and_columns_once_packed():
    """``onednn_operand``: what the lean step multiplies by itself. Nothing before the first
    decoding pass packs, for passes wider than the packing serves, or after the block."""
    model = _policy().model
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    with torch.no_grad(), packed_linear.prepacked_linears(model, rows=3, new_tokens=8):
        assert packed_linear.onednn_operand(attn.q_proj, 3) is None  # not packed yet
        model(input_ids=torch.randint(5, 100, (3, 1)))  # a decoding pass packs every layer
        q, k, v = (packed_linear.onednn_operand(m, 3) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
        assert q is not None and k is not None and v is not None
        assert q.packed is k.packed is v.packed  # one stacked weight, columns in q, k, v order
        assert (q.start, k.start, v.start) == (0, attn.q_proj.out_features, attn.q_proj.out_features + 32)
        o = packed_linear.onednn_operand(attn.o_proj, 3)
        gate, up = packed_linear.onednn_operand(mlp.gate_proj, 3), packed_linear.onednn_operand(mlp.up_proj, 3)
        assert o is not None and o.start == 0 and o.packed is not q.packed
        assert gate is not None and up is not None and up.packed is gate.packed and up.start == 128
        x = torch.randn(3, 64)
        stacked = fp32_layout.onednn_linear(x, q.packed, q.bias)
        k_alone = F.linear(x, k.packed.to_dense()[k.start : v.start])
        torch.testing.assert_close(stacked[:, k.start : v.start], k_alone, atol=1e-5, rtol=1e-5)
        wide = max(3, packed_linear._ONEDNN_PACK_MAX_ROWS) + 1
        assert packed_linear.onednn_operand(attn.q_proj, wide) is None  # such a pass runs plain
        packed_linear._broken.add(packed_linear.FP32_ONEDNN)  # switched off (the fixture switches it back on)
        assert packed_linear.onednn_operand(attn.q_proj, 3) is None
        packed_linear._broken.discard(packed_linear.FP32_ONEDNN)
    assert packed_linear.onednn_operand(attn.q_proj, 3) is None  # the block is over
