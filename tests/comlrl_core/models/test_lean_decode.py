"""The lean decoding step (comlrl_core.models.lean_decode): transformers' arithmetic without its
module machinery, used only where it gives transformers' numbers, and never past a hook."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from comlrl_core.models import lean_decode, lean_ops
from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.models.joint_generation import GenerationRequest, generate_together
from comlrl_core.models.kv_cache import reserve_cache
from comlrl_core.models.sampling import padded_position_ids, sample_next_tokens, sample_tokens
from comlrl_core.policy import GenerationConfig

PROMPTS = ["def add(a, b):", "Write a story about a team of agents that", "x"]


@pytest.fixture
def policy():
    torch.manual_seed(0)
    return TransformersPolicy.from_source("tiny-random", device="cpu")


def _sample(policy, lean: bool, monkeypatch, **kwargs):
    from comlrl_core.models import hf_policy

    monkeypatch.setattr(hf_policy, "sample_tokens", lambda *a, **k: sample_tokens(*a, lean_step=lean, **k))
    cfg = GenerationConfig(max_new_tokens=kwargs.pop("max_new_tokens", 12), **kwargs)
    return [[c.token_ids for c in group] for group in policy.generate(PROMPTS, 3, cfg, seed=list(range(9)))]


def _count_lean_steps(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = lean_decode.LeanDecoder.step

    def counted(self, ids, *args, **kwargs):
        out = real(self, ids, *args, **kwargs)
        if out is not None:
            calls.append(ids.shape[0])
        return out

    monkeypatch.setattr(lean_decode.LeanDecoder, "step", counted)
    return calls


def test_one_step_gives_the_logits_and_cache_of_the_models_forward(policy):
    """Left-padded rows of different lengths, several steps: the lean step's logits and the
    keys/values it writes are those of transformers' forward from the same cache."""
    model = policy.model
    ids, mask = policy._left_pad([policy.encode_prompt(p) for p in PROMPTS])
    decoder = lean_decode.lean_decoder(model)
    assert decoder is not None
    with torch.no_grad():
        positions = padded_position_ids(mask)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        lean_cache = reserve_cache(out.past_key_values, 8)
        plain = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True).past_key_values
        step_ids = out.logits[:, -1].argmax(-1, keepdim=True)
        step_pos = positions[:, -1:]
        for _ in range(4):
            step_pos = step_pos + 1
            mask = torch.cat([mask, torch.ones(len(PROMPTS), 1, dtype=mask.dtype)], dim=1)
            expected = model(
                input_ids=step_ids, attention_mask=mask, position_ids=step_pos, past_key_values=plain, use_cache=True
            )
            plain = expected.past_key_values
            lean = decoder.step(step_ids, mask, step_pos, lean_cache, None)
            assert lean is not None and lean.shape == (len(PROMPTS), model.config.vocab_size)
            torch.testing.assert_close(lean, expected.logits[:, -1].float(), atol=1e-5, rtol=1e-5)
            for lean_layer, plain_layer in zip(lean_cache.layers, plain.layers, strict=True):
                torch.testing.assert_close(lean_layer.keys, plain_layer.keys, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(lean_layer.values, plain_layer.values, atol=1e-5, rtol=1e-5)
            step_ids = lean.argmax(-1, keepdim=True)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampling_gives_the_same_tokens_with_and_without_the_lean_step(policy, monkeypatch, temperature):
    steps = _count_lean_steps(monkeypatch)
    lean = _sample(policy, True, monkeypatch, temperature=temperature)
    assert len(steps) > 1, "the lean step never ran past its probe"
    assert lean_decode.unsupported_reason(policy.model) is None  # the probe kept it on
    assert _sample(policy, False, monkeypatch, temperature=temperature) == lean


def test_shared_lora_base_agents_get_their_own_adapters_in_the_lean_step(lora_team, monkeypatch):
    """Two adapters in one batch (row slices) and one agent alone (peft's active adapter):
    the same completions as transformers' forward gives."""
    cfg = GenerationConfig(max_new_tokens=10, temperature=1.0, top_k=20)
    requests = [
        GenerationRequest(["hello there", "a much longer prompt about many things"], 3, cfg, list(range(11, 17))),
        GenerationRequest(["x", "yy zz"], 3, cfg, list(range(21, 27))),
    ]
    ids = lambda results: [[[c.token_ids for c in g] for g in agent] for agent in results]  # noqa: E731
    steps = _count_lean_steps(monkeypatch)
    together = ids(generate_together(list(lora_team), requests))
    alone = [_sample(member, True, monkeypatch) for member in lora_team]
    assert len(steps) > 2
    assert all(lean_decode.unsupported_reason(member.model) is None for member in lora_team)  # never switched off
    assert together[0] != together[1]  # the adapters really differ
    without = [_sample(member, False, monkeypatch) for member in lora_team]
    assert alone == without
    from comlrl_core.models import hf_policy  # the joint sampler samples through the lead policy

    monkeypatch.setattr(hf_policy, "sample_tokens", lambda *a, **k: sample_tokens(*a, lean_step=False, **k))
    steps.clear()
    assert ids(generate_together(list(lora_team), requests)) == together
    assert not steps


def test_a_forward_hook_on_the_model_keeps_transformers_forward(policy, monkeypatch):
    """A hook (a logits processor, a probe) would be skipped by the lean step: with one
    installed every step runs the model's forward, and the hook sees it."""
    steps = _count_lean_steps(monkeypatch)
    seen: list[int] = []
    handle = policy.model.register_forward_hook(lambda module, args, output: seen.append(1))
    try:
        _sample(policy, True, monkeypatch, max_new_tokens=6)
    finally:
        handle.remove()
    assert not steps
    assert len(seen) >= 6  # the prefill and every decoding step went through the forward
    _sample(policy, True, monkeypatch, max_new_tokens=6)
    assert steps  # hook gone: lean again


def test_a_mismatching_step_switches_the_model_back_for_good(policy, monkeypatch, caplog):
    """The probe compares the model's first lean step with its forward; a lean step that
    gives other logits is never used, and the samples are transformers'."""
    expected = _sample(policy, False, monkeypatch)
    real = lean_decode.LeanDecoder.step

    def shifted(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        return None if out is None else out + 0.5

    monkeypatch.setattr(lean_decode.LeanDecoder, "step", shifted)
    with caplog.at_level(logging.WARNING, logger=lean_decode.__name__):
        assert _sample(policy, True, monkeypatch) == expected
        assert _sample(policy, True, monkeypatch) == expected
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "lean decoding step off" in warnings[0] and "differ" in warnings[0]
    assert lean_decode.lean_decoder(policy.model) is None
    assert "differ" in (lean_decode.unsupported_reason(policy.model) or "")


def test_models_outside_its_reach_are_left_to_transformers():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64))
    assert lean_decode.lean_decoder(model) is None
    assert "not LlamaForCausalLM" in (lean_decode.unsupported_reason(model) or "")


def test_a_cache_without_room_is_refused_untouched(policy):
    model = policy.model
    ids, mask = policy._left_pad([policy.encode_prompt(p) for p in PROMPTS])
    decoder = lean_decode.lean_decoder(model)
    assert decoder is not None
    with torch.no_grad():
        cache = model(input_ids=ids, attention_mask=mask, use_cache=True).past_key_values  # growing layers
        before = [layer.keys.clone() for layer in cache.layers]
        step = torch.ones(len(PROMPTS), 1, dtype=torch.long)
        mask = torch.cat([mask, torch.ones(len(PROMPTS), 1, dtype=mask.dtype)], dim=1)
        assert decoder.step(step, mask, padded_position_ids(mask)[:, -1:], cache, None) is None
    assert all(torch.equal(a, layer.keys) for a, layer in zip(before, cache.layers, strict=True))


# -- the draw behind every sampled token ------------------------------------------------
def test_one_generator_draws_each_row_from_its_distribution():
    probs = torch.tensor([0.1, 0.0, 0.2, 0.7])
    logits = probs.clamp(min=1e-30).log().expand(4000, 4).clone()
    logits[:, 1] = float("-inf")
    draws = sample_next_tokens(logits, 1.0, 0, 1.0, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=4).double() / draws.numel()
    assert freq[1] == 0  # never a zero-probability entry
    # 4000 draws: 4 standard errors of the largest share are about 0.03
    torch.testing.assert_close(freq, probs.double(), atol=0.03, rtol=0)
    again = sample_next_tokens(logits, 1.0, 0, 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)


@settings(max_examples=30, deadline=None)
@given(
    weights=st.lists(st.floats(0.0, 10.0), min_size=2, max_size=12).filter(lambda w: sum(w) > 0.5),
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(1, 6),
)
def test_a_draw_is_always_a_token_of_positive_probability(weights, seed, rows):
    probs = torch.tensor(weights, dtype=torch.float32)
    logits = torch.where(probs > 0, probs.log(), torch.tensor(float("-inf"))).expand(rows, -1)
    drawn = sample_next_tokens(logits, 1.0, 0, 1.0, torch.Generator().manual_seed(seed))
    assert drawn.shape == (rows,)
    assert bool((probs[drawn] > 0).all())


def _mixed_adapter_setup(lora_team, names_of_rows):
    """A prefilled cache for rows of the shared base, each row through its own adapter."""
    lead = lora_team[0]
    model = lead.model
    model.eval()  # peft takes adapter_names in eval mode only
    prompts = ["def add(a, b):", "a longer prompt about agents", "x", "yy zz", "hello"][: len(names_of_rows)]
    ids, mask = lead._left_pad([lead.encode_prompt(p) for p in prompts])
    positions = padded_position_ids(mask)
    with torch.no_grad():
        out = model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, adapter_names=names_of_rows
        )
    return model, out, mask, positions


def _step_from(decoder, out, mask, positions, names, in_call: bool):
    cache = reserve_cache(copy.deepcopy(out.past_key_values), 4)
    step_ids = out.logits[:, -1].argmax(-1, keepdim=True)
    step_mask = torch.cat([mask, torch.ones(mask.shape[0], 1, dtype=mask.dtype)], dim=1)
    if in_call:
        decoder.start_call()
    try:
        with torch.no_grad():
            return decoder.step(step_ids, step_mask, positions[:, -1:] + 1, cache, names)
    finally:
        if in_call:
            decoder.end_call()


def test_adapters_of_a_mixed_batch_are_stacked_with_the_same_logits(lora_team, monkeypatch):
    """Rows of two adapters in three runs: inside a sampling call each LoRA layer runs both
    adapters in two products (stacked, rows masked to their own block); the logits are
    those of the per-run path and of transformers' forward."""
    a, b = (member.adapter_name for member in lora_team)
    names = [a, a, b, b, a]
    model, out, mask, positions = _mixed_adapter_setup(lora_team, names)
    decoder = lean_decode.lean_decoder(model)
    assert decoder is not None
    built = []
    real = decoder._stacked
    monkeypatch.setattr(decoder, "_stacked", lambda module, dtype: built.append(real(module, dtype)) or built[-1])
    stacked = _step_from(decoder, out, mask, positions, names, in_call=True)
    assert built and all(s is not None and [n for n, _ in s.layout] == [a, b] for s in built)
    per_run = _step_from(decoder, out, mask, positions, names, in_call=False)
    torch.testing.assert_close(stacked, per_run, atol=1e-5, rtol=1e-5)
    reference = model(
        input_ids=out.logits[:, -1].argmax(-1, keepdim=True),
        attention_mask=torch.cat([mask, torch.ones(len(names), 1, dtype=mask.dtype)], dim=1),
        position_ids=positions[:, -1:] + 1,
        past_key_values=copy.deepcopy(out.past_key_values),
        adapter_names=names,
    ).logits[:, -1]
    torch.testing.assert_close(stacked, reference.float(), atol=1e-5, rtol=1e-5)
    assert not decoder._stacks  # dropped when the call ended


def test_stacked_adapters_are_rebuilt_for_each_call(lora_team):
    """Weights change between calls (an update): the next call stacks the new ones."""
    a, b = (member.adapter_name for member in lora_team)
    names = [a, b, b]
    model, out, mask, positions = _mixed_adapter_setup(lora_team, names)
    decoder = lean_decode.lean_decoder(model)
    before = _step_from(decoder, out, mask, positions, names, in_call=True)
    changed = [w for n, w in lora_team[1].named_parameters() if "lora_B" in n and f".{b}." in n]
    saved = [w.detach().clone() for w in changed]
    with torch.no_grad():
        for weight in changed:
            weight.mul_(-2.0)
    try:
        after = _step_from(decoder, out, mask, positions, names, in_call=True)
        per_run = _step_from(decoder, out, mask, positions, names, in_call=False)
    finally:  # the team is shared by this module's tests
        with torch.no_grad():
            for weight, value in zip(changed, saved, strict=True):
                weight.copy_(value)
    assert not torch.allclose(before[1:], after[1:], atol=1e-3)  # agent b's rows see its new weights
    torch.testing.assert_close(after, per_run, atol=1e-5, rtol=1e-5)


def test_the_row_masks_follow_the_runs_of_each_step(lora_team):
    """Each step's masks come from that step's runs (rows leave the batch between steps)."""
    a, b = (member.adapter_name for member in lora_team)
    x = torch.ones(4, 3)
    layout = ((a, 2), (b, 1))
    first = lean_ops.StepRuns([(a, 0, 1), (b, 1, 3), (a, 3, 4)])
    assert first.mask(layout, x).tolist() == [[1, 1, 0], [0, 0, 1], [0, 0, 1], [1, 1, 0]]
    assert first.mask(layout, x) is first.mask(layout, x)  # built once per step and layout
    later = lean_ops.StepRuns([(b, 0, 2)])
    assert later.mask(layout, x[:2]).tolist() == [[0, 0, 1], [0, 0, 1]]
    assert lean_ops.StepRuns([(b, 0, 1), ("__base__", 1, 2)]).mask(((b, 2),), x[:2]).tolist() == [[1, 1], [0, 0]]


def test_an_adapter_with_active_dropout_keeps_the_per_run_path(lora_team):
    a, b = (member.adapter_name for member in lora_team)
    decoder = lean_decode.lean_decoder(lora_team[0].model)
    layer = decoder.layers[0].self_attn.q_proj
    decoder.start_call()
    decoder._call_adapters = (a, b)
    original = layer.lora_dropout[a]
    try:
        layer.lora_dropout[a] = torch.nn.Dropout(0.5).train()
        assert decoder._stacked(layer, torch.float32) is None
    finally:
        layer.lora_dropout[a] = original
        decoder.end_call()
    decoder.start_call()
    decoder._call_adapters = (a, b)
    assert decoder._stacked(layer, torch.float32) is not None
    decoder.end_call()
    decoder.start_call()
    decoder._call_adapters = (a, b)
    assert decoder._stacked(layer, torch.bfloat16) is None  # inputs of another dtype than the adapters
    decoder.end_call()
