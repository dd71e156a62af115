"""LoRA layers' no-grad forward with the update added in place: peft's outputs, peft's own
path wherever the lean one does not apply (comlrl_core/models/lean_lora.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from comlrl_core.models import lean_lora
from comlrl_core.models.joint_generation import GenerationRequest, generate_together
from comlrl_core.models.lean_lora import add_lora_update, lean_lora_forwards
from comlrl_core.policy import GenerationConfig


def _lora_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if lean_lora.is_vanilla_lora_linear(m)]


def _lean_calls(monkeypatch) -> list[int]:
    """One entry per in-place update taken."""
    calls: list[int] = []
    real = lean_lora.add_lora_update

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(lean_lora, "add_lora_update", counted)
    return calls


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 5),
    positions=st.integers(1, 4),
    rank=st.integers(1, 6),
    scaling=st.floats(0.1, 4.0),
    columns_of_wider=st.booleans(),
)
def test_the_in_place_update_equals_peft_s_formula(rows, positions, rank, scaling, columns_of_wider):
    gen = torch.Generator().manual_seed(rows * 100 + positions * 10 + rank)
    x = torch.randn(rows, positions, 12, generator=gen)
    lora_a, lora_b = nn.Linear(12, rank, bias=False), nn.Linear(rank, 9, bias=False)
    with torch.no_grad():
        lora_a.weight.normal_(generator=gen)
        lora_b.weight.normal_(generator=gen)
        base = torch.randn(rows, positions, 9 + 5 * columns_of_wider, generator=gen)
        out = base[..., :9]  # a decoding pass hands out columns of a stacked product: a view
        expected = out + lora_b(lora_a(x)) * scaling
        got = add_lora_update(out, x, lora_a, lora_b, scaling)
    assert got is out  # in place
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)
    if columns_of_wider:  # the other columns untouched
        assert torch.equal(base[..., 9:], base[..., 9:].clone())


def test_an_output_no_view_can_flatten_still_gets_the_update():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 6, generator=gen)
    lora_a, lora_b = nn.Linear(6, 2, bias=False), nn.Linear(2, 5, bias=False)
    out = torch.randn(4, 3, 5, generator=gen).transpose(0, 1)  # [3, 4, 5], rows not mergeable
    with torch.no_grad():
        expected = out + lora_b(lora_a(x)) * 2.0
        got = add_lora_update(out, x, lora_a, lora_b, 2.0)
    assert torch.allclose(got, expected, atol=1e-5)


def test_a_lora_model_gives_peft_s_outputs_and_gets_its_forwards_back(lora_team, monkeypatch):
    model = lora_team[0].model.eval()
    lora_team[0].activate()
    ids = torch.randint(3, 50, (2, 7))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        calls = _lean_calls(monkeypatch)
        with lean_lora_forwards(model) as switched:
            got = model(input_ids=ids).logits
    layers = _lora_layers(model)
    assert switched == len(layers) > 0 and len(calls) == len(layers)  # every layer took the lean path
    assert torch.allclose(got, expected, atol=1e-5)
    assert not any("forward" in m.__dict__ for m in layers)
    base = lora_team[0].model
    with torch.no_grad(), base.disable_adapter():
        plain = base(input_ids=ids).logits
    assert not torch.allclose(expected, plain, atol=1e-3)  # the adapters do change the outputs


def test_gradients_per_row_adapters_and_disabled_adapters_keep_peft_s_path(lora_team, monkeypatch):
    policy = lora_team[0]
    model = policy.model.eval()
    policy.activate()
    ids = torch.randint(3, 50, (2, 5))
    calls = _lean_calls(monkeypatch)
    with lean_lora_forwards(model):
        loss = model(input_ids=ids).logits.sum()  # gradients on: the adapters train
        loss.backward()
        with torch.no_grad():
            model(input_ids=ids, adapter_names=["agent_0", "agent_1"])  # per-row adapters: peft's route
            with model.disable_adapter():
                model(input_ids=ids)
    assert calls == []
    grads = [p.grad for name, p in model.named_parameters() if "lora_A.agent_0" in name]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
    model.zero_grad(set_to_none=True)


def test_an_active_dropout_keeps_peft_s_path(monkeypatch):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from comlrl_core.models.tiny import tiny_model_path

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_path()),
        LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, target_modules=["q_proj", "v_proj"]),
    )
    ids = torch.randint(3, 50, (1, 5))
    calls = _lean_calls(monkeypatch)
    with torch.no_grad(), lean_lora_forwards(model):
        model.train()
        model(input_ids=ids)  # dropout on: peft's path
        assert calls == []
        model.eval()
        model(input_ids=ids)  # dropout off: the lean path
    assert len(calls) == len(_lora_layers(model)) > 0


@pytest.mark.parametrize("joint", [False, True])
def test_a_lora_sampling_call_adds_updates_in_place(lora_team, monkeypatch, joint):
    calls = _lean_calls(monkeypatch)
    from comlrl_core.models import mixed_adapters

    monkeypatch.setattr(mixed_adapters, "add_lora_update", lean_lora.add_lora_update)  # counted too
    cfg = GenerationConfig(max_new_tokens=3, temperature=0.0)
    if joint:  # both agents' rows in one call: per-row adapters on row slices
        requests = [
            GenerationRequest(["def f():"], 1, cfg, seed=[0]),
            GenerationRequest(["def g():"], 1, cfg, seed=[1]),
        ]
        generate_together(lora_team.policies, requests)
    else:
        lora_team[0].generate(["def f():"], 1, cfg, seed=0)
    assert calls  # the prompt pass went through the in-place update
    assert not any("forward" in m.__dict__ for m in _lora_layers(lora_team[0].model))


def test_per_row_adapter_slices_update_in_place_only_without_gradients(lora_team, monkeypatch):
    from comlrl_core.models import mixed_adapters

    model = lora_team[0].model.eval()
    calls = _lean_calls(monkeypatch)
    monkeypatch.setattr(mixed_adapters, "add_lora_update", lean_lora.add_lora_update)  # counted
    ids = torch.randint(3, 50, (2, 5))
    names = ["agent_0", "agent_1"]
    adapters = [p for name, p in model.named_parameters() if "lora_" in name]
    trainable = [p.requires_grad for p in adapters]
    for p in adapters:  # both agents train (peft freezes the inactive adapter otherwise)
        p.requires_grad_(True)
    with torch.no_grad():
        expected = model(input_ids=ids, adapter_names=names).logits  # peft's gathered rows
    with mixed_adapters.sliced_adapter_batches(model):
        model(input_ids=ids, adapter_names=names).logits.sum().backward()  # gradients: no in-place update
        assert calls == []
        with torch.no_grad():
            got = model(input_ids=ids, adapter_names=names).logits
    assert calls and torch.allclose(got, expected, atol=1e-5)
    grads = [p.grad for name, p in model.named_parameters() if "lora_B.agent_1" in name]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
    model.zero_grad(set_to_none=True)
    for p, flag in zip(adapters, trainable, strict=True):
        p.requires_grad_(flag)


def test_a_joint_sampling_call_lists_the_models_modules_only_through_its_walk(lora_team, monkeypatch):
    from comlrl_core.models.cpu import model_walk

    model = lora_team[0].model
    listed: list[str] = []
    real_modules, real_tree = nn.Module.modules, model_walk.module_tree

    def counted_modules(self):
        if self is model:
            listed.append("modules()")
        return real_modules(self)

    def counted_tree(root):
        if root is model:
            listed.append("walk")
        return real_tree(root)

    monkeypatch.setattr(nn.Module, "modules", counted_modules)
    monkeypatch.setattr(model_walk, "module_tree", counted_tree)
    cfg = GenerationConfig(max_new_tokens=3, temperature=0.0)
    requests = [GenerationRequest(["def f():"], 1, cfg, seed=[0]), GenerationRequest(["def g():"], 1, cfg, seed=[1])]
    generate_together(lora_team.policies, requests)
    # one walk shared by the mode check, the packing, the in-place LoRA forwards and the
    # per-row adapter slices (which listed model.modules() on their own before)
    assert listed == ["walk"]
