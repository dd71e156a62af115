"""The lean decoding step's direct routes (comlrl_core.models.lean_packed): layers packed in
oneDNN's fp32 format computed straight from their packed weights, or at 1-3 rows from
their plain weights through the few-row kernel, a LoRA team's adapters stacked per
product, with the numbers of the route through the modules."""

from __future__ import annotations

import pytest
import torch
from onednn_marks import needs_onednn

from comlrl_core.models import lean_decode
from comlrl_core.models.cpu import fp32_layout, packed_linear, row_products
from comlrl_core.models.cpu.row_products import RowOperand
from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.models.kv_cache import reserve_cache
from comlrl_core.models.sampling import padded_position_ids
from comlrl_core.policy import GenerationConfig

PROMPTS = ["def add(a, b):", "Write a story about a team of agents that", "x"]
LORA_PROMPTS = ["def add(a, b):", "a longer prompt about agents", "x", "yy zz", "hello"]


@pytest.fixture
def policy():
    torch.manual_seed(0)
    return TransformersPolicy.from_source("tiny-random", device="cpu")


# -- a full model -------------------------------------------------------------------------
def _count_packed_forwards(monkeypatch) -> list[int]:
    """Records one entry per call of a packed layer's module (``_PackedForward``)."""
    calls: list[int] = []
    real = packed_linear._PackedForward.__call__

    def counted(self, x):
        calls.append(1)
        return real(self, x)

    monkeypatch.setattr(packed_linear._PackedForward, "__call__", counted)
    return calls


def _packed_setup(policy, monkeypatch):
    """The policy's model with oneDNN's layout forced, its lean decoder, and the list that
    records every call of a packed layer's module."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    decoder = lean_decode.lean_decoder(policy.model)
    assert decoder is not None
    return policy.model, decoder, _count_packed_forwards(monkeypatch)


@needs_onednn
def test_a_packed_full_model_takes_each_layers_products_straight_from_the_packed_weights(policy, monkeypatch):
    """Once packed (the call's first decoding step), a layer runs its stacked q/k/v and
    gate/up products on the packed weights without calling its modules: the same logits
    and keys/values, bit for bit, as the step through the modules from the same cache,
    and transformers' logits within rounding."""
    model, decoder, calls = _packed_setup(policy, monkeypatch)
    layers = len(model.model.layers)
    ids, mask = policy._left_pad([policy.encode_prompt(p) for p in PROMPTS])
    through_modules = lean_decode.packed_layer
    with torch.no_grad(), packed_linear.prepacked_linears(model, rows=len(PROMPTS), new_tokens=8):
        positions = padded_position_ids(mask)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        cache = reserve_cache(out.past_key_values, 8)
        step_ids, step_pos = out.logits[:, -1].argmax(-1, keepdim=True), positions[:, -1:]
        decoder.start_call()
        for step in range(4):
            step_pos = step_pos + 1
            mask = torch.cat([mask, torch.ones(len(PROMPTS), 1, dtype=mask.dtype)], dim=1)
            calls.clear()
            direct = decoder.step(step_ids, mask, step_pos, cache, None)
            assert direct is not None
            if step == 0:  # through the modules: that pass packs the weights
                assert len(calls) == 7 * layers + 1 and not decoder._packed_layers
                continue
            assert len(calls) == 1  # the output layer only
            assert sorted(decoder._packed_layers) == list(range(layers))
            written = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
            for layer in cache.layers:
                layer.drop_newest()
            monkeypatch.setattr(lean_decode, "packed_layer", lambda *args: None)
            decoder._packed_layers.clear()
            calls.clear()
            moduled = decoder.step(step_ids, mask, step_pos, cache, None)
            assert moduled is not None and len(calls) == 7 * layers + 1
            monkeypatch.setattr(lean_decode, "packed_layer", through_modules)
            assert torch.equal(direct, moduled)
            for (keys, values), layer in zip(written, cache.layers, strict=True):
                assert torch.equal(keys, layer.keys) and torch.equal(values, layer.values)
            for layer in cache.layers:  # transformers from the same cache
                layer.drop_newest()
            expected = model(input_ids=step_ids, attention_mask=mask, position_ids=step_pos, past_key_values=cache)
            torch.testing.assert_close(direct, expected.logits[:, -1].float(), atol=1e-5, rtol=1e-5)
            step_ids = direct.argmax(-1, keepdim=True)
        decoder.end_call()
    assert not decoder._packed_layers  # per call: the next call's packing is its own


@needs_onednn
def test_a_packed_model_with_gradients_on_steps_through_its_modules(policy, monkeypatch):
    model, decoder, calls = _packed_setup(policy, monkeypatch)
    layers = len(model.model.layers)
    ids, mask = policy._left_pad([policy.encode_prompt(p) for p in PROMPTS])
    with packed_linear.prepacked_linears(model, rows=len(PROMPTS), new_tokens=8):
        positions = padded_position_ids(mask)  # the cache made with gradients on, as the step below runs
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        cache = reserve_cache(out.past_key_values, 8)
        mask = torch.cat([mask, torch.ones(len(PROMPTS), 1, dtype=mask.dtype)], dim=1)
        step_ids, step_pos = out.logits[:, -1].argmax(-1, keepdim=True), positions[:, -1:] + 1
        decoder.start_call()
        with torch.no_grad():
            decoder.step(step_ids, mask, step_pos, cache, None)  # packs every layer
            for layer in cache.layers:
                layer.drop_newest()
        assert packed_linear.onednn_operand(model.model.layers[0].self_attn.q_proj, len(PROMPTS)) is not None
        calls.clear()
        logits = decoder.step(step_ids, mask, step_pos, cache, None)
        decoder.end_call()
    assert logits is not None and logits.requires_grad  # the plain layers, with their gradients
    assert len(calls) == 7 * layers + 1


# -- a LoRA team on one shared base ------------------------------------------------------
def _lora_steps(
    lora_team, monkeypatch, names, steps: int = 3, in_call: bool = True, few_row_kernel: bool = False, rows=None
):
    """Decoding steps of the lead's model, packed in oneDNN's format, rows through
    ``names`` (None: the lead's active adapter for every row). Yields, from the second step
    on (the first packs), (decoder, calls, logits, the keys and values written, cache, step
    inputs) with the step undone from the cache; the caller recomputes it other ways, each
    leaving the cache as it found it."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    lead = lora_team[0]
    lead.activate()
    model = lead.model
    model.eval()  # peft takes adapter_names in eval mode only
    decoder = lean_decode.lean_decoder(model)
    assert decoder is not None
    calls = _count_packed_forwards(monkeypatch)
    rows = len(names) if names is not None else rows or len(LORA_PROMPTS)
    ids, mask = lead._left_pad([lead.encode_prompt(p) for p in LORA_PROMPTS[:rows]])
    adapters = {"adapter_names": list(names)} if names is not None else {}
    packing = packed_linear.prepacked_linears(model, rows=rows, new_tokens=8, few_row_kernel=few_row_kernel)
    with torch.no_grad(), packing:
        positions = padded_position_ids(mask)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **adapters)
        cache = reserve_cache(out.past_key_values, 8)
        step_ids, step_pos = out.logits[:, -1].argmax(-1, keepdim=True), positions[:, -1:]
        decoder.start_call()
        if not in_call:
            decoder.end_call()
        try:
            for step in range(steps):
                step_pos = step_pos + 1
                mask = torch.cat([mask, torch.ones(rows, 1, dtype=mask.dtype)], dim=1)
                calls.clear()
                logits = decoder.step(step_ids, mask, step_pos, cache, names)
                assert logits is not None
                if step > 0:
                    written = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
                    for layer in cache.layers:
                        layer.drop_newest()
                    yield decoder, calls, logits, written, cache, (step_ids, mask, step_pos, adapters)
                    decoder.step(step_ids, mask, step_pos, cache, names)  # the step back in the cache
                step_ids = logits.argmax(-1, keepdim=True)
        finally:
            decoder.end_call()
    assert not decoder._packed_layers  # per call: the next call stacks its own adapters


def _through_modules(decoder, cache, inputs, names, monkeypatch):
    """The same step through the layers' modules (the packed and few-row routes switched
    off): its logits and the keys and values it writes."""
    step_ids, mask, step_pos, _ = inputs
    through, rows = lean_decode.packed_layer, lean_decode.row_layer
    monkeypatch.setattr(lean_decode, "packed_layer", lambda *args: None)
    monkeypatch.setattr(lean_decode, "row_layer", lambda *args: None)
    found = dict(decoder._packed_layers)
    decoder._packed_layers.clear()
    try:
        logits = decoder.step(step_ids, mask, step_pos, cache, names)
    finally:
        monkeypatch.setattr(lean_decode, "packed_layer", through)
        monkeypatch.setattr(lean_decode, "row_layer", rows)
        decoder._packed_layers.update(found)
    written = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    for layer in cache.layers:
        layer.drop_newest()
    return logits, written


def _transformers(model, cache, inputs):
    step_ids, mask, step_pos, adapters = inputs
    logits = model(input_ids=step_ids, attention_mask=mask, position_ids=step_pos, past_key_values=cache, **adapters)
    for layer in cache.layers:
        layer.drop_newest()
    return logits.logits[:, -1].float()


@needs_onednn
def test_a_packed_lora_team_adds_each_products_stacked_adapters_straight_from_the_packed_weights(
    lora_team, monkeypatch
):
    """Rows of two adapters in three runs: once packed, each layer runs four products on the
    packed base weights, each with both adapters stacked (q/k/v's three siblings in one
    block matrix), rows masked to their own adapter; the logits and keys/values are those
    of the route through the modules and transformers' logits those too, within rounding."""
    a, b = (member.adapter_name for member in lora_team)
    names = [a, a, b, b, a]
    model = lora_team[0].model
    layers = len(lora_team[0].model.get_base_model().model.layers)
    rank = model.get_base_model().model.layers[0].self_attn.q_proj.lora_A[a].weight.shape[0]
    checked = 0
    for decoder, calls, logits, written, cache, inputs in _lora_steps(lora_team, monkeypatch, names):
        assert len(calls) == 1  # the output layer's module only
        assert sorted(decoder._packed_layers) == list(range(layers))
        first = decoder._packed_layers[0]
        assert first.qkv.adapters is not None and first.qkv.adapters.layout == ((a, 3 * rank), (b, 3 * rank))
        assert first.gate_up.adapters is not None and first.gate_up.adapters.layout == ((a, 2 * rank), (b, 2 * rank))
        assert first.o.adapters is not None and first.o.adapters.layout == ((a, rank), (b, rank))
        moduled, moduled_cache = _through_modules(decoder, cache, inputs, names, monkeypatch)
        torch.testing.assert_close(logits, moduled, atol=1e-5, rtol=1e-5)
        for (keys, values), (keys_m, values_m) in zip(written, moduled_cache, strict=True):
            torch.testing.assert_close(keys, keys_m, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(values, values_m, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits, _transformers(model, cache, inputs), atol=1e-5, rtol=1e-5)
        # the masks matter: every row through adapter a gives other logits for b's rows
        single, _ = _through_modules(decoder, cache, inputs, [a] * len(names), monkeypatch)
        assert not torch.allclose(logits[2:4], single[2:4], atol=1e-3)
        checked += 1
    assert checked == 2


@needs_onednn
def test_a_lora_agent_sampling_alone_adds_its_active_adapter_unmasked(lora_team, monkeypatch):
    """No adapter names (one agent's call): every row through the active adapter, whose
    stacks hold that adapter alone; the numbers of the modules' route and transformers'."""
    a = lora_team[0].adapter_name
    model = lora_team[0].model
    masks = []
    real_mask = lean_decode.StepRuns.mask
    monkeypatch.setattr(lean_decode.StepRuns, "mask", lambda self, *args: masks.append(1) or real_mask(self, *args))
    for decoder, calls, logits, _, cache, inputs in _lora_steps(lora_team, monkeypatch, None):
        assert len(calls) == 1
        layouts = {p.qkv.adapters.layout for p in decoder._packed_layers.values() if p.qkv.adapters is not None}
        assert len(layouts) == 1 and [name for name, _ in layouts.pop()] == [a]
        moduled, _ = _through_modules(decoder, cache, inputs, None, monkeypatch)
        torch.testing.assert_close(logits, moduled, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits, _transformers(model, cache, inputs), atol=1e-5, rtol=1e-5)
    assert not masks


class _TrainingDropout(torch.nn.Dropout):
    def train(self, mode: bool = True) -> _TrainingDropout:
        return super().train(True)


@needs_onednn
def test_lora_layers_outside_a_call_or_with_active_dropout_keep_the_modules(lora_team, monkeypatch):
    """Adapter stacks live for one sampling call: outside one every layer goes through its
    modules; inside one, a layer with an adapter in dropout does (the rest go straight)."""
    a, b = (member.adapter_name for member in lora_team)
    names = [a, b, b]
    layers = len(lora_team[0].model.get_base_model().model.layers)
    for _, calls, _, _, _, _ in _lora_steps(lora_team, monkeypatch, names, steps=2, in_call=False):
        assert len(calls) == 7 * layers + 1
    q_proj = lora_team[0].model.get_base_model().model.layers[0].self_attn.q_proj
    original = q_proj.lora_dropout[b]
    q_proj.lora_dropout[b] = _TrainingDropout(0.5)  # stays in training mode through model.eval()
    try:
        for decoder, calls, _, _, _, _ in _lora_steps(lora_team, monkeypatch, names, steps=2):
            assert len(calls) == 7 + 1 and 0 not in decoder._packed_layers
    finally:
        q_proj.lora_dropout[b] = original


# -- one to three rows: the plain weights through the few-row kernel ---------------------
needs_row_kernel = pytest.mark.skipif(
    row_products.kernel_status() != "on", reason=f"few-row kernel off: {row_products.kernel_status()}"
)


@needs_onednn
@needs_row_kernel
@pytest.mark.parametrize("rows", [1, 2, 3])
def test_a_few_row_call_packs_nothing_and_reads_the_plain_weights_through_the_kernel(
    policy, monkeypatch, record_results, rows
):
    """At 1-3 rows a call told that its step has the few-row kernel packs nothing (oneDNN's
    layout forced); from its first step every layer runs its four products on the plain
    weights (q/k/v and gate/up as one kernel call each), 4 kernel calls a layer plus the
    output layer's; the logits are the modules' route's and transformers', within rounding."""
    model, decoder, packed_calls = _packed_setup(policy, monkeypatch)
    kernel_calls = record_results(row_products, "product")  # True: the kernel ran the product
    layers = len(model.model.layers)
    ids, mask = policy._left_pad([policy.encode_prompt(p) for p in PROMPTS[:rows]])
    with torch.no_grad(), packed_linear.prepacked_linears(model, rows=rows, new_tokens=8, few_row_kernel=True):
        positions = padded_position_ids(mask)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        cache = reserve_cache(out.past_key_values, 8)
        step_ids, step_pos = out.logits[:, -1].argmax(-1, keepdim=True), positions[:, -1:]
        decoder.start_call()
        try:
            for _ in range(3):
                step_pos = step_pos + 1
                mask = torch.cat([mask, torch.ones(rows, 1, dtype=mask.dtype)], dim=1)
                kernel_calls.clear()
                logits = decoder.step(step_ids, mask, step_pos, cache, None)
                assert logits is not None and not packed_calls
                assert kernel_calls == [True] * (4 * layers + 1)
                assert sorted(decoder._packed_layers) == list(range(layers))
                first = decoder._packed_layers[0]
                assert isinstance(first.qkv.weight, RowOperand) and len(first.qkv.weight.weights) == 3
                assert isinstance(first.gate_up.weight, RowOperand) and len(first.gate_up.weight.weights) == 2
                assert (
                    first.qkv.weight.weights[1].data_ptr() == model.model.layers[0].self_attn.k_proj.weight.data_ptr()
                )
                inputs = (step_ids, mask, step_pos, {})
                written = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
                for layer in cache.layers:
                    layer.drop_newest()
                moduled, moduled_cache = _through_modules(decoder, cache, inputs, None, monkeypatch)
                torch.testing.assert_close(logits, moduled, atol=1e-5, rtol=1e-5)
                for (keys, values), (keys_m, values_m) in zip(written, moduled_cache, strict=True):
                    torch.testing.assert_close(keys, keys_m, atol=1e-5, rtol=1e-5)
                    torch.testing.assert_close(values, values_m, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(logits, _transformers(model, cache, inputs), atol=1e-5, rtol=1e-5)
                decoder.step(step_ids, mask, step_pos, cache, None)  # the step back in the cache
                step_ids = logits.argmax(-1, keepdim=True)
        finally:
            decoder.end_call()


@needs_onednn
@needs_row_kernel
def test_four_rows_or_the_kernel_off_pack_as_before(policy, monkeypatch):
    """The plan packs nothing only for a call of at most MAX_ROWS rows whose step has the
    kernel, with the kernel on."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    model = policy.model
    few = row_products.MAX_ROWS
    assert packed_linear.packing_plan(model, few, 64, few_row_kernel=True).format is None
    assert packed_linear.packing_plan(model, few, 64).format == packed_linear.FP32_ONEDNN
    assert packed_linear.packing_plan(model, few + 1, 64, few_row_kernel=True).format == packed_linear.FP32_ONEDNN
    monkeypatch.setattr(row_products, "_kernel", lambda: "switched off by the test")
    assert packed_linear.packing_plan(model, 1, 64, few_row_kernel=True).format == packed_linear.FP32_ONEDNN


@needs_row_kernel
@pytest.mark.parametrize("names_of", [lambda a, b: [a, b], lambda a, b: [b, a, a], lambda a, b: None])
def test_a_few_row_lora_team_adds_its_stacked_adapters_to_the_kernels_products(
    lora_team, monkeypatch, record_results, names_of
):
    """Rows of two adapters (or one agent alone) at 1-3 rows: the base products through the
    kernel on the plain weights, each product's adapters stacked and masked per row; the
    logits of the modules' route and of transformers within rounding, and the masks matter."""
    a, b = (member.adapter_name for member in lora_team)
    names = names_of(a, b)
    kernel_calls = record_results(row_products, "product")  # True: the kernel ran the product
    model = lora_team[0].model
    layers = len(model.get_base_model().model.layers)
    checked = 0
    for decoder, calls, logits, _, cache, inputs in _lora_steps(
        lora_team, monkeypatch, names, few_row_kernel=True, rows=row_products.MAX_ROWS
    ):
        assert not calls and kernel_calls and all(kernel_calls)  # nothing packed, the kernel ran every product
        assert sorted(decoder._packed_layers) == list(range(layers))
        assert all(isinstance(p.down.weight, RowOperand) for p in decoder._packed_layers.values())
        moduled, _ = _through_modules(decoder, cache, inputs, names, monkeypatch)
        torch.testing.assert_close(logits, moduled, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(logits, _transformers(model, cache, inputs), atol=1e-5, rtol=1e-5)
        if names is not None and len(set(names)) > 1:
            single, _ = _through_modules(decoder, cache, inputs, [a] * len(names), monkeypatch)
            differs = [i for i, name in enumerate(names) if name != a]
            assert not torch.allclose(logits[differs], single[differs], atol=1e-3)
        kernel_calls.clear()
        checked += 1
    assert checked == 2


@needs_onednn
@needs_row_kernel
def test_a_one_row_sampling_call_decodes_the_tokens_it_decodes_without_the_kernel(policy, monkeypatch, record_results):
    """Through the policy, oneDNN's layout forced: a one-row greedy call packs nothing and
    runs its steps in the kernel, and picks the tokens the packed products pick with the
    kernel off."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    packed_calls = _count_packed_forwards(monkeypatch)
    kernel_calls = record_results(row_products, "product")  # True: the kernel ran the product
    config = GenerationConfig(max_new_tokens=6, temperature=0.0)
    with_kernel = [[c.token_ids for c in group] for group in policy.generate(PROMPTS[1:2], 1, config)]
    assert kernel_calls and all(kernel_calls) and not packed_calls
    monkeypatch.setattr(row_products, "_kernel", lambda: "switched off by the test")
    kernel_calls.clear()
    without = [[c.token_ids for c in group] for group in policy.generate(PROMPTS[1:2], 1, config)]
    assert not any(kernel_calls) and packed_calls and without == with_kernel
