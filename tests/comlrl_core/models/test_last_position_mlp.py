"""The last decoder layer's MLP on the last position only, in prompt passes that keep the
cache and the last logits (comlrl_core/models/last_position_mlp.py)."""

from __future__ import annotations

import functools

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from comlrl_core.models import last_position_mlp as tail
from comlrl_core.models import prefill, sampling
from comlrl_core.models.agent_spec import AgentSpec
from comlrl_core.models.last_position_mlp import last_layer_mlp, last_position_mlp
from comlrl_core.models.swiglu import has_lean_swiglu, use_lean_swiglu
from comlrl_core.models.team import Team
from comlrl_core.policy import GenerationConfig

_SMALL = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,  # hidden / heads, spelled out: Qwen3's default is 128
    max_position_embeddings=128,
)


def _model(config_name: str, **overrides) -> nn.Module:
    torch.manual_seed(0)
    config = getattr(transformers, config_name)(**{**_SMALL, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config)
    for p in model.parameters():  # peakier than the default init: differences show
        nn.init.normal_(p, std=0.2)
    return model.eval()


def _left_padded(rows: int = 2, width: int = 9):
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 97, (rows, width), generator=gen)
    mask = torch.ones(rows, width, dtype=torch.long)
    mask[0, :3] = 0  # a shorter first row
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def _mlp_input_positions(mlp: nn.Module) -> list[int]:
    """Positions each call of ``mlp``'s first projection saw (a hook on the projection,
    not on the MLP: hooks on the MLP itself turn the switch off)."""
    seen: list[int] = []
    first = next(m for m in mlp.modules() if isinstance(m, nn.Linear))
    first.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))
    return seen


@pytest.mark.parametrize("config_name", ["LlamaConfig", "MistralConfig", "Qwen2Config", "Qwen3Config"])
def test_a_prompt_pass_keeps_the_cache_and_last_logits_with_the_mlp_on_one_position(config_name):
    model = _model(config_name)
    ids, mask, positions = _left_padded()
    kwargs = dict(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    seen = _mlp_input_positions(model.model.layers[-1].mlp)
    with torch.no_grad():
        full = model(**kwargs)
        with last_position_mlp(model) as switched:
            trimmed = model(**kwargs)
    assert switched is True
    assert seen == [9, 1]  # the whole prompt before, the last position inside the block
    assert torch.allclose(trimmed.logits, full.logits, atol=1e-5, rtol=1e-5)
    for plain, cut in zip(full.past_key_values.layers, trimmed.past_key_values.layers, strict=True):
        assert torch.equal(plain.keys, cut.keys) and torch.equal(plain.values, cut.values)
    assert "forward" not in model.model.layers[-1].mlp.__dict__  # its own forward is back


def test_the_earlier_positions_are_not_the_models_so_hidden_states_turn_it_off():
    model = _model("LlamaConfig")
    ids, mask, positions = _left_padded()
    with torch.no_grad():
        with last_position_mlp(model):
            cut = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        full = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    # the documented trade: the earlier positions' logits are not the model's
    assert not torch.allclose(cut[:, :-1], full[:, :-1], atol=1e-3)
    assert torch.allclose(cut[:, -1], full[:, -1], atol=1e-5, rtol=1e-5)
    asking = _model("LlamaConfig", output_hidden_states=True)
    with last_position_mlp(asking) as switched:
        assert switched is False
    assert last_layer_mlp(asking) is None


def test_passes_with_gradients_or_one_position_run_the_whole_mlp():
    model = _model("LlamaConfig")
    ids, mask, positions = _left_padded()
    seen = _mlp_input_positions(model.model.layers[-1].mlp)
    with last_position_mlp(model):
        loss = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.sum()
        with torch.no_grad():
            model(input_ids=ids[:, -1:], attention_mask=mask[:, -1:], position_ids=positions[:, -1:])
    assert seen == [9, 1]
    loss.backward()
    assert model.model.layers[-1].mlp.down_proj.weight.grad.abs().sum() > 0


def test_an_mlp_with_hooks_or_a_wrapper_or_an_unknown_layer_is_left_alone():
    hooked = _model("LlamaConfig")
    seen: list[tuple[int, ...]] = []
    hooked.model.layers[-1].mlp.register_forward_hook(lambda m, args, out: seen.append(tuple(out.shape)))
    ids, mask, positions = _left_padded()
    with torch.no_grad(), last_position_mlp(hooked) as switched:
        hooked(input_ids=ids, attention_mask=mask, position_ids=positions)
    assert switched is False and seen == [(2, 9, 32)]  # the user's hook saw the whole pass

    wrapped = _model("LlamaConfig")
    mlp = wrapped.model.layers[-1].mlp
    own = mlp.__dict__["forward"] = lambda x: type(mlp).forward(mlp, x)
    with last_position_mlp(wrapped) as switched:
        assert switched is False
    assert mlp.__dict__["forward"] is own  # someone else's wrapper stays

    class RenamedLayer(type(wrapped.model.layers[-1])):  # a layer class not known to be position-wise
        pass

    other = _model("LlamaConfig")
    other.model.layers[-1].__class__ = RenamedLayer
    assert last_layer_mlp(other) is None


def test_the_mlp_gets_its_forward_back_when_the_pass_fails():
    model = _model("LlamaConfig")
    with pytest.raises(RuntimeError, match="boom"), last_position_mlp(model):
        assert "forward" in model.model.layers[-1].mlp.__dict__
        raise RuntimeError("boom")
    assert "forward" not in model.model.layers[-1].mlp.__dict__


def test_per_row_lora_adapters_keep_their_last_logits():
    peft = pytest.importorskip("peft")
    model = _model("LlamaConfig")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["gate_proj", "up_proj", "down_proj", "q_proj"])
    model = peft.get_peft_model(model, config, adapter_name="first")
    model.add_adapter("second", config)
    model.eval()
    for name, weight in model.named_parameters():
        if "lora_B" in name:
            nn.init.normal_(weight, std=0.5)
    ids, mask, positions = _left_padded()
    kwargs = dict(
        input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1, adapter_names=["first", "second"]
    )
    with torch.no_grad():
        full = model(**kwargs).logits
        with last_position_mlp(model) as switched:
            cut = model(**kwargs).logits
        only_a = model(**{**kwargs, "adapter_names": ["first", "first"]}).logits
    assert switched is True
    assert torch.allclose(cut, full, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(full[1], only_a[1], atol=1e-3)  # the adapters differ at the last position


@pytest.mark.parametrize("budget", [None, 12])
def test_the_sampler_s_prompt_passes_run_the_last_mlp_on_one_position_with_the_same_tokens(budget, monkeypatch):
    model = _model("LlamaConfig")
    ids, mask, _ = _left_padded(rows=3, width=20)
    mask[2, :5] = 0
    seen = _mlp_input_positions(model.model.layers[-1].mlp)

    def sample():
        return sampling.sample_tokens(
            model,
            ids,
            mask,
            max_new_tokens=5,
            eos_token_ids=[0],
            pad_token_id=0,
            generator=[torch.Generator().manual_seed(r) for r in range(6)],
            num_samples=2,
            prefill_token_budget=budget,
            lean_step=False,  # every step through the MLP module, so the hook sees them all
        ).tokens

    with_tail = sample()
    prompt_passes = [n for n in seen if n > 1]
    seen.clear()
    monkeypatch.setattr(tail, "last_layer_mlp", lambda model: None)
    without = sample()
    assert prompt_passes == [] and max(seen) > 1  # with the tail, no pass of several positions reached the MLP
    assert torch.equal(with_tail, without)


def test_our_lean_swiglu_mlp_is_switched_and_gets_its_lean_forward_back():
    model = _model("LlamaConfig")
    assert use_lean_swiglu(model) == 3
    mlp = model.model.layers[-1].mlp
    assert last_layer_mlp(model) is mlp  # our own forward is position-wise: wrapped, not refused
    seen = _mlp_input_positions(mlp)
    ids, mask, positions = _left_padded()
    with torch.no_grad(), last_position_mlp(model) as switched:
        model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1)
    assert switched is True and seen == [1]
    assert has_lean_swiglu(mlp)


def test_a_policy_s_prompt_pass_runs_the_last_mlp_on_one_position():
    policy = Team.from_specs([AgentSpec(model="tiny-random")])[0]
    base = policy.model.get_base_model() if hasattr(policy.model, "get_base_model") else policy.model
    seen = _mlp_input_positions(base.model.layers[-1].mlp)
    policy.generate(["def add(a, b):"], 2, GenerationConfig(max_new_tokens=3), seed=0)
    assert seen and set(seen) == {1}  # the prompt pass too
    seen.clear()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tail, "last_layer_mlp", lambda model: None)
        policy.generate(["def add(a, b):"], 2, GenerationConfig(max_new_tokens=3), seed=0)
    assert max(seen) > 1  # without it the prompt pass runs the MLP on every position


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 14), min_size=1, max_size=4),
    shared=st.integers(0, 20),
    budget=st.sampled_from([None, 8, 24]),
    num_samples=st.integers(1, 2),
)
def test_any_prompt_batch_prefills_the_same_cache_and_last_logits(lengths, shared, budget, num_samples):
    """Whatever the rows' lengths, padding, chunking and shared beginning: the chunked
    prefill inside the block writes the same cache and the same last logits as without."""
    model = _prefill_model()
    gen = torch.Generator().manual_seed(sum(lengths) * 31 + shared)
    beginning = torch.randint(1, 97, (shared,), generator=gen).tolist()
    prompts = [beginning + torch.randint(1, 97, (n,), generator=gen).tolist() for n in lengths]
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache_name = sampling.cache_kwarg_name(model)

    def prefilled():
        return prefill.chunked_prefill(
            model,
            ids,
            mask,
            positions,
            budget=budget or 10_000,
            num_samples=num_samples,
            extra_tokens=3,
            row_adapters=None,
            forward_kwargs={cache_name: None, "logits_to_keep": 1},
            cache_name=cache_name,
        )

    with torch.no_grad():
        plain = prefilled()
        with last_position_mlp(model) as switched:
            cut = prefilled()
    assert switched and plain is not None and cut is not None
    assert torch.allclose(cut[1], plain[1], atol=1e-5, rtol=1e-5)  # last logits
    assert torch.equal(cut[2], plain[2])  # the cache's mask
    for a, b in zip(plain[0].layers, cut[0].layers, strict=True):
        assert torch.allclose(a.keys, b.keys, atol=1e-6) and torch.allclose(a.values, b.values, atol=1e-6)


@functools.cache
def _prefill_model() -> nn.Module:
    """One tiny Llama for every example (built once: hypothesis calls the test many times)."""
    model = _model("LlamaConfig")
    use_lean_swiglu(model)
    return model
