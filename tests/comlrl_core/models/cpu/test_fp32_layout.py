"""The fp32 weight layout for decoding, chosen by measurement (comlrl_core.models.cpu.fp32_layout)
and used by the packed layers (comlrl_core.models.cpu.packed_linear)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from onednn_marks import needs_onednn

from comlrl_core.models.cpu import fp32_layout, packed_linear
from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.policy import GenerationConfig

PROMPTS = ["def add(a, b):", "Write a story about a team", "x"]


@pytest.fixture(autouse=True)
def measuring(monkeypatch):
    """Each test measures (``auto``); conftest starts it without measurements."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "auto")


def test_row_classes():
    assert [fp32_layout.row_class(r) for r in (0, 1, 2, 7, 8, 16, 500)] == [1, 1, 4, 4, 16, 16, 16]


@pytest.mark.parametrize(("value", "expected"), [("", None), ("auto", None), ("MKL", "mkl"), (" onednn ", "onednn")])
def test_the_environment_forces_a_layout(monkeypatch, value, expected):
    monkeypatch.setenv(fp32_layout.ENV_VAR, value)
    assert fp32_layout.forced_layout() == expected
    if expected is not None:  # forced even for weights too small to measure
        assert fp32_layout.layout_for([torch.zeros(4, 4)], rows=1, new_tokens=8) == expected


def test_an_unknown_forced_layout_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv(fp32_layout.ENV_VAR, "mkldnn")
    with pytest.raises(
        ValueError, match=r"COMLRL_FP32_LAYOUT='mkldnn'.*'auto' \(the default: measure\), 'mkl' or 'onednn'"
    ):
        fp32_layout.layout_for([torch.zeros(4, 4)], rows=1, new_tokens=8)


def test_small_models_keep_mkl_without_measuring(monkeypatch):
    monkeypatch.setattr(fp32_layout, "measure", _must_not_measure)
    weights = [torch.zeros(64, 64)] * 10
    assert fp32_layout.layout_for(weights, rows=16, new_tokens=100) == "mkl"
    assert fp32_layout.measured() == []


def _must_not_measure(weights, rows):
    raise AssertionError("measured a model below MEASURE_MIN_BYTES")


def _fake_measure(plain_ms: float, packed_ms: float, pack_ms: float, calls: list[int], packed_as: str = "oneDNN"):
    def measure(weights, rows):
        calls.append(rows)
        return fp32_layout.Measurement(rows, plain_ms, packed_ms, pack_ms, 1.0, torch.get_num_threads(), packed_as)

    return measure


@pytest.mark.parametrize(
    ("plain_ms", "packed_ms", "pack_ms", "new_tokens", "expected"),
    [
        (60.0, 27.0, 200.0, 48, "onednn"),  # 33 ms a step x 48 steps > 200 ms of packing
        (60.0, 27.0, 200.0, 6, "mkl"),  # 6 steps do not win the packing back
        (60.0, 27.0, 200.0, None, "onednn"),  # call length unknown: assumed to pay
        (28.2, 27.8, 200.0, 1000, "mkl"),  # 1% faster: noise, not a reason to pack
        (13.4, 21.1, 200.0, 1000, "mkl"),  # slower (a Xeon at one row)
    ],
)
def test_the_choice_follows_the_measurement(monkeypatch, plain_ms, packed_ms, pack_ms, new_tokens, expected):
    calls: list[int] = []
    monkeypatch.setattr(fp32_layout, "measure", _fake_measure(plain_ms, packed_ms, pack_ms, calls))
    monkeypatch.setattr(fp32_layout, "MEASURE_MIN_BYTES", 0)
    weights = [torch.zeros(8, 8)]
    assert fp32_layout.layout_for(weights, rows=16, new_tokens=new_tokens) == expected
    assert calls == [16]


def test_one_measurement_per_row_class_and_weight_shapes(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(fp32_layout, "measure", _fake_measure(60.0, 27.0, 1.0, calls))
    monkeypatch.setattr(fp32_layout, "MEASURE_MIN_BYTES", 0)
    weights = [torch.zeros(8, 8), torch.zeros(16, 8)]
    for rows in (16, 9, 12, 3, 5, 1, 1, 16):
        fp32_layout.layout_for(weights, rows=rows, new_tokens=48)
    assert calls == [16, 4, 1]
    fp32_layout.layout_for([torch.zeros(8, 8)], rows=16, new_tokens=48)  # another model's shapes
    assert calls == [16, 4, 1, 16]
    assert [m.rows for m in fp32_layout.measured()] == [16, 4, 1, 16]


@needs_onednn
def test_a_real_measurement_times_both_layouts():
    weights = [torch.randn(96, 64), torch.randn(64, 96)]
    m = fp32_layout.measure(weights, rows=4)
    assert m.rows == 4 and m.threads == torch.get_num_threads()
    assert m.plain_ms > 0 and m.packed_ms > 0 and m.pack_ms > 0
    assert m.weight_mb == pytest.approx((96 * 64 * 2) * 4 / 1e6)
    assert "4 row(s)" in m.describe() and "oneDNN-packed" in m.describe()


def test_the_first_pass_of_each_layout_is_not_timed(monkeypatch):
    """First calls create oneDNN's kernels and touch fresh inputs: a pass each runs before
    the timed turns, which then number _REPEATS a side."""
    passes: list[str] = []
    monkeypatch.setattr(fp32_layout, "_timed_pass", lambda fn, ops: passes.append(fn.__name__) or 1.0)
    fp32_layout.measure_mkl_packing([torch.randn(64, 32)], rows=4)
    plain, packed = passes[0], passes[1]
    assert plain != packed and passes.count(plain) == passes.count(packed) == fp32_layout._REPEATS + 1


@needs_onednn
@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 90),  # padded counts (5, 13, 70...) and exact ones
    packed_for=st.sampled_from([1, 4, 16]),
    leading=st.sampled_from([(), (2,)]),
    bias=st.booleans(),
)
def test_one_packing_serves_every_row_count(rows, packed_for, leading, bias):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(48, 32, generator=gen)
    b = torch.randn(48, generator=gen) if bias else None
    x = torch.randn(*leading, rows, 32, generator=gen)
    packed = fp32_layout.onednn_pack(weight, packed_for)
    out = fp32_layout.onednn_linear(x, packed, b)
    assert out.shape == (*leading, rows, 48)
    assert torch.allclose(out, F.linear(x, weight, b), atol=1e-5, rtol=1e-5)


@given(rows=st.integers(1, 2000))
def test_row_counts_are_padded_to_a_few_kernels(rows):
    padded = fp32_layout.onednn_rows(rows)
    assert rows <= padded and fp32_layout.onednn_rows(padded) == padded
    if rows <= fp32_layout.ONEDNN_ROW_COUNTS[-1]:
        assert padded in fp32_layout.ONEDNN_ROW_COUNTS
    else:
        assert padded % fp32_layout.ONEDNN_ROW_STEP == 0 and padded - rows < fp32_layout.ONEDNN_ROW_STEP


@needs_onednn
def test_a_pass_over_any_decoding_rows_meets_at_most_the_listed_row_counts(monkeypatch):
    """oneDNN keeps a compiled kernel per row count for the process: rows 1-64 meet 18."""
    seen: set[int] = set()
    real = torch.ops.mkldnn._linear_pointwise

    class Ops:
        @staticmethod
        def _linear_pointwise(x, *args):
            seen.add(x.shape[0])
            return real(x, *args)

    packed = fp32_layout.onednn_pack(torch.randn(48, 32), 16)
    monkeypatch.setattr(torch.ops, "mkldnn", Ops)
    for rows in range(1, 65):
        fp32_layout.onednn_linear(torch.randn(rows, 32), packed, None)
    assert seen == set(fp32_layout.ONEDNN_ROW_COUNTS)


@needs_onednn
def test_padding_rows_left_over_from_a_wider_pass_do_not_leak_into_a_narrower_one():
    weight = torch.randn(48, 32)
    packed = fp32_layout.onednn_pack(weight, 16)
    fp32_layout.onednn_linear(torch.full((14, 32), 1e6), packed, None)  # fills the 14-row buffer
    x = torch.randn(13, 32)
    out = fp32_layout.onednn_linear(x, packed, None)
    assert out.shape == (13, 48) and torch.allclose(out, x @ weight.T, atol=1e-5)


# -- the packed layers in the oneDNN layout --------------------------------------------------


def _policy() -> TransformersPolicy:
    torch.manual_seed(0)
    return TransformersPolicy.from_source("tiny-random", device="cpu")


def _samples(policy: TransformersPolicy, temperature: float = 0.0) -> list[list[list[int]]]:
    cfg = GenerationConfig(max_new_tokens=8, temperature=temperature)
    out = policy.generate(PROMPTS, num_samples=2, generation_config=cfg, seed=3)
    return [[c.token_ids for c in row] for row in out]


@needs_onednn
def test_forced_onednn_packs_every_layer_with_the_same_logits(monkeypatch):
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    policy = _policy()
    linears = [m for m in policy.model.modules() if isinstance(m, torch.nn.Linear)]
    groups, singles = packed_linear.onednn_units(policy.model)
    assert len(groups) == 4  # q/k/v and gate/up of the tiny model's 2 layers (narrow k/v included)
    packable = [m for group in groups for m in group] + singles
    assert len(packable) == len(linears)
    ids = torch.randint(5, 100, (21, 1))  # a decoding-shaped pass: one position per row
    with torch.no_grad():
        plain = policy.model(input_ids=ids).logits
        with packed_linear.prepacked_linears(policy.model, rows=21, new_tokens=8) as active:
            assert active
            forwards = [m.__dict__.get("forward") for m in packable]
            assert all(isinstance(f, packed_linear._PackedForward) for f in forwards)
            assert {f.format for f in forwards} == {packed_linear.FP32_ONEDNN}
            packed = policy.model(input_ids=ids).logits  # 21 rows of one position: packed at this pass
            assert all((f.siblings[0].packed if f.siblings else f.packed) is not None for f in forwards)
    assert not any("forward" in m.__dict__ for m in linears)
    assert torch.allclose(plain, packed, atol=1e-4)


@needs_onednn
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_samples_are_the_same_in_either_layout(monkeypatch, temperature):
    policy = _policy()
    monkeypatch.setenv(fp32_layout.ENV_VAR, "mkl")
    mkl = _samples(policy, temperature)
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    assert _samples(policy, temperature) == mkl


@needs_onednn
def test_a_measured_win_packs_in_onednn(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(fp32_layout, "measure", _fake_measure(60.0, 27.0, 1.0, calls))
    monkeypatch.setattr(fp32_layout, "MEASURE_MIN_BYTES", 0)
    policy = _policy()
    assert packed_linear.packing_plan(policy.model, rows=16, new_tokens=48).format == packed_linear.FP32_ONEDNN
    assert calls == [16]
    # a measured loss keeps the MKL route (the vocabulary projection packed where it pays)
    monkeypatch.setattr(fp32_layout, "_measured", {})
    monkeypatch.setattr(fp32_layout, "measure", _fake_measure(27.0, 60.0, 1.0, calls))
    assert packed_linear.packing_plan(policy.model, rows=16, new_tokens=64).format == packed_linear.FP32_MKL
    assert packed_linear.packing_plan(policy.model, rows=16, new_tokens=8).format is None  # MKL's rule: too short


@needs_onednn
def test_a_failing_onednn_op_switches_that_layout_off_with_the_same_samples(monkeypatch, caplog):
    policy = _policy()
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    expected = _samples(policy)

    def raising(*args, **kwargs):
        raise RuntimeError("private op changed its schema")

    monkeypatch.setattr(fp32_layout, "onednn_linear", raising)
    with caplog.at_level("WARNING", logger=packed_linear.__name__):
        assert _samples(policy) == expected
    assert packed_linear.FP32_ONEDNN in packed_linear._broken
    assert "fp32-onednn linear weights are off from now on" in caplog.text
    assert packed_linear.packing_plan(policy.model, rows=6, new_tokens=None).format != packed_linear.FP32_ONEDNN


@needs_onednn
def test_the_prefill_runs_plain_and_the_first_decoding_pass_packs(monkeypatch):
    """oneDNN packing is paid at the first pass of decoding size, not by the prefill."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    packs: list[tuple[int, ...]] = []
    real_pack = fp32_layout.onednn_pack

    def counting_pack(weight, rows):
        packs.append(tuple(weight.shape))
        return real_pack(weight, rows)

    monkeypatch.setattr(fp32_layout, "onednn_pack", counting_pack)
    layer = torch.nn.Linear(64, 96)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    with torch.no_grad(), packed_linear.prepacked_linears(layer, rows=4, new_tokens=8) as active:
        assert active
        prefill = torch.randn(2, 40, 64)  # 80 rows: more than the call decodes, and more than 64
        assert torch.allclose(layer(prefill), F.linear(prefill, weight, bias), atol=1e-5)
        assert packs == []
        step = torch.randn(4, 64)
        assert torch.allclose(layer(step), F.linear(step, weight, bias), atol=1e-5)
        assert torch.allclose(layer(step[:1]), F.linear(step[:1], weight, bias), atol=1e-5)
        assert torch.allclose(layer(prefill), F.linear(prefill, weight, bias), atol=1e-5)
    assert packs == [(96, 64)]  # once, then every row count on the same packing


@needs_onednn
def test_a_short_pass_of_several_positions_runs_plain_and_does_not_pack(monkeypatch):
    """A prompt beginning shared by a call's prompts is prefilled alone, often in fewer than
    64 tokens: it is a prefill all the same. Packing there made every later prefill chunk
    rebuild each plain weight from its packed copy."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    packs: list[tuple[int, ...]] = []
    dense: list[int] = []
    real_pack, real_to_dense = fp32_layout.onednn_pack, torch.Tensor.to_dense

    def counting_pack(weight, rows):
        packs.append(tuple(weight.shape))
        return real_pack(weight, rows)

    def counting_to_dense(self, *args, **kwargs):
        dense.append(1)
        return real_to_dense(self, *args, **kwargs)

    monkeypatch.setattr(fp32_layout, "onednn_pack", counting_pack)
    monkeypatch.setattr(torch.Tensor, "to_dense", counting_to_dense)
    layer = torch.nn.Linear(64, 96)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    with torch.no_grad(), packed_linear.prepacked_linears(layer, rows=16, new_tokens=8):
        shared = torch.randn(1, 20, 64)  # 20 positions of one row: under 64 rows, still a prefill
        assert torch.allclose(layer(shared), F.linear(shared, weight, bias), atol=1e-5)
        assert packs == [] and layer.weight.numel() == weight.numel()
        chunk = torch.randn(4, 30, 64)  # a prefill chunk on top of it
        assert torch.allclose(layer(chunk), F.linear(chunk, weight, bias), atol=1e-5)
        assert dense == []  # the plain weight was never released, so never rebuilt
        step = torch.randn(16, 1, 64)  # transformers' decoding step: one position per row
        assert torch.allclose(layer(step), F.linear(step, weight, bias), atol=1e-5)
        assert packs == [(96, 64)] and layer.weight.numel() == 0
    assert dense == [1]  # the plain values back once, when the call ends
    assert torch.equal(layer.weight.detach(), weight)


@needs_onednn
def test_sampling_packs_the_layers_in_the_first_decoding_step_only(monkeypatch):
    """Prompts with a shared beginning (prefilled alone, then the chunks on top): no layer
    weight is packed during the prefill (the output layer, fed one position per row, may
    be), each one once in the first decoding step, and the plain values are rebuilt only
    once, at the end of the call."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    policy = _policy()
    events: list[tuple[str, object]] = []
    real_pack, real_to_dense = fp32_layout.onednn_pack, torch.Tensor.to_dense

    def recording_pack(weight, rows):
        events.append(("pack", tuple(weight.shape)))
        return real_pack(weight, rows)

    def recording_to_dense(self, *args, **kwargs):
        events.append(("dense", None))
        return real_to_dense(self, *args, **kwargs)

    def recording_forward(module, inputs):
        events.append(("forward", inputs[0].shape[-1]))

    shared = "Please read the following request carefully and answer in one line. "
    prompts = [shared + "Add two numbers.", shared + "Reverse a list of words.", shared + "x"]
    encoded = [policy.encode_prompt(p) for p in prompts]
    common = next(i for i, (a, b) in enumerate(zip(encoded[0], encoded[1], strict=False)) if a != b)
    assert 16 <= common < 64  # long enough for a shared pass, and under 64 tokens
    expected = _shared_samples(policy, prompts)
    monkeypatch.setattr(fp32_layout, "onednn_pack", recording_pack)
    monkeypatch.setattr(torch.Tensor, "to_dense", recording_to_dense)
    handle = policy.model.get_input_embeddings().register_forward_pre_hook(recording_forward)
    try:
        assert _shared_samples(policy, prompts) == expected
    finally:
        handle.remove()
    head = tuple(policy.model.get_output_embeddings().weight.shape)
    groups, packable = packed_linear.onednn_units(policy.model)  # packable: the layers packed alone
    prefills = [i for i, (kind, size) in enumerate(events) if kind == "forward" and size != 1]
    first_step = events.index(("forward", 1))
    second_step = events.index(("forward", 1), first_step + 1)
    assert len(prefills) >= 2 and prefills[-1] < first_step  # the shared beginning, then the chunk(s)
    assert all(size == head for kind, size in events[:first_step] if kind == "pack")
    packs_in_first_step = [size for kind, size in events[first_step:second_step] if kind == "pack"]
    units = len(groups) + len(packable)  # each set of siblings packed as one stacked weight
    assert len(packs_in_first_step) + events[:first_step].count(("pack", head)) == units
    assert sum(kind == "pack" for kind, _ in events) == units  # once each
    assert ("dense", None) not in events[:second_step]
    released = len(groups) + sum(m.weight is not policy.model.get_input_embeddings().weight for m in packable)
    assert sum(kind == "dense" for kind, _ in events) == released  # the restore, once each


def _shared_samples(policy: TransformersPolicy, prompts: list[str]) -> list[list[list[int]]]:
    cfg = GenerationConfig(max_new_tokens=6, temperature=0.0)
    out = policy.generate(prompts, num_samples=2, generation_config=cfg, seed=3)
    return [[c.token_ids for c in row] for row in out]


@needs_onednn
def test_a_packed_weight_replaces_the_plain_one_until_the_call_ends(monkeypatch):
    """The call holds an untied weight once (packed); its exact values come back at the end."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    layer = torch.nn.Linear(64, 96)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    param = layer.weight
    step = torch.randn(4, 64)
    with torch.no_grad(), packed_linear.prepacked_linears(layer, rows=4, new_tokens=8):
        assert torch.allclose(layer(step), F.linear(step, weight, bias), atol=1e-5)
        assert layer.weight.numel() == 0  # the plain storage is released while packed
        assert layer.weight is param and layer.weight.dtype == torch.float32
    assert layer.weight is param and torch.equal(layer.weight, weight)
    assert param.requires_grad and "forward" not in layer.__dict__


@needs_onednn
def test_a_prefill_after_the_packing_runs_plain_on_the_released_weight(monkeypatch, record_onednn_rows):
    """oneDNN would keep a kernel for every prefill width: wide passes stay on the plain GEMM."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    layer = torch.nn.Linear(64, 96)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    widths = record_onednn_rows()
    with torch.no_grad(), packed_linear.prepacked_linears(layer, rows=4, new_tokens=8):
        layer(torch.randn(4, 64))  # packs, releases the plain weight
        assert layer.weight.numel() == 0
        prefill = torch.randn(3, 50, 64)  # 150 rows: a second prompt group's prefill
        assert torch.allclose(layer(prefill), F.linear(prefill, weight, bias), atol=1e-5)
        assert layer.weight.numel() == 0  # still released: the plain copy was temporary
    assert widths == [4]
    assert torch.equal(layer.weight.detach(), weight)


@needs_onednn
def test_a_tied_weight_keeps_its_plain_values_beside_the_packed_copy(monkeypatch):
    """SmolLM2's lm_head shares the embeddings' weight: the embedding lookup must still work."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    embed, head = torch.nn.Embedding(96, 64), torch.nn.Linear(64, 96, bias=False)
    head.weight = embed.weight
    model = torch.nn.ModuleDict({"embed": embed, "head": head})
    weight = embed.weight.detach().clone()
    ids = torch.tensor([[3, 7, 11, 95]])
    with torch.no_grad(), packed_linear.prepacked_linears(model, rows=4, new_tokens=8):
        hidden = embed(ids)[0]
        assert torch.allclose(head(hidden), hidden @ weight.T, atol=1e-5)
        assert torch.equal(embed(ids)[0], weight[ids[0]])  # still the plain weight
    assert torch.equal(embed.weight, weight) and head.weight is embed.weight


@needs_onednn
def test_a_pass_needing_the_plain_layer_gets_its_weight_back(monkeypatch):
    """A pass with gradients inside the block (or after a failing op) runs the plain layer on
    the restored values, and they are still exact after the block."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    layer = torch.nn.Linear(64, 96)
    weight = layer.weight.detach().clone()
    step = torch.randn(4, 64)
    with packed_linear.prepacked_linears(layer, rows=4, new_tokens=8):
        with torch.no_grad():
            layer(step)
        assert layer.weight.numel() == 0
        out = layer(step)  # gradients on: the plain layer
        out.sum().backward()
        assert torch.equal(layer.weight.detach(), weight)
        assert torch.allclose(layer.weight.grad, torch.ones(4, 96).T @ step, atol=1e-5)
    assert torch.equal(layer.weight.detach(), weight)


@needs_onednn
def test_a_weight_that_cannot_be_restored_raises_and_keeps_its_packed_copy(monkeypatch):
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    layer = torch.nn.Linear(64, 96)
    weight, bias = layer.weight.detach().clone(), layer.bias.detach().clone()
    step = torch.randn(4, 64)

    def failing_restore(self):
        raise MemoryError("no room")

    with pytest.raises(RuntimeError, match="COMLRL_FP32_LAYOUT=mkl"):
        with monkeypatch.context() as patch, torch.no_grad():
            patch.setattr(packed_linear._PackedForward, "restore", failing_restore)
            with packed_linear.prepacked_linears(layer, rows=4, new_tokens=8):
                layer(step)
    with torch.no_grad():  # the packed copy still serves, and gives the values back on demand
        assert torch.allclose(layer(step), F.linear(step, weight, bias), atol=1e-5)
    layer.__dict__["forward"].restore()
    assert torch.equal(layer.weight.detach(), weight)


def test_low_rank_factors_are_not_packed_in_onednn():
    factor = torch.nn.Linear(576, 8, bias=False)  # a LoRA A matrix
    square = torch.nn.Linear(576, 576)
    assert not packed_linear._packable(factor, packed_linear.FP32_ONEDNN)
    assert packed_linear._packable(square, packed_linear.FP32_ONEDNN)
    assert packed_linear._packable(factor, packed_linear.BF16)  # bf16 packs every layer, as before


def test_unset_measures(monkeypatch):
    """The default measures: where the packed layout wins it is used, without being asked for."""
    monkeypatch.delenv(fp32_layout.ENV_VAR)
    monkeypatch.setattr(fp32_layout, "measure", _onednn_wins)
    monkeypatch.setattr(fp32_layout, "MEASURE_MIN_BYTES", 0)
    assert fp32_layout.layout_for([torch.zeros(64, 64)], rows=16, new_tokens=100) == "onednn"
    assert len(fp32_layout.measured()) == 1


def _onednn_wins(weights, rows):
    return fp32_layout.Measurement(rows, 60.0, 27.0, 200.0, 1.0, 2)


def test_a_measurement_packs_a_sample_of_the_weights_not_all(monkeypatch):
    """The measurement's packed copies are transient memory: a sample of whole blocks."""
    block = [torch.zeros(576, 576), torch.zeros(192, 576), torch.zeros(1536, 576)]  # 1.33, 0.44, 3.54 MB
    weights = block * 40  # 212 MB
    sample = fp32_layout.measured_sample(weights, max_bytes=20 << 20)
    assert [id(w) for w in sample] == [id(w) for w in weights[: len(sample)]]
    sampled = sum(w.numel() * 4 for w in sample)
    assert 20 << 20 <= sampled < (20 << 20) + 576 * 1536 * 4  # reaches the cap by less than one weight
    assert [id(w) for w in fp32_layout.measured_sample(weights[2:], max_bytes=1)] == [id(weights[2])]

    passed: list[int] = []

    def recording_measure(measured_weights, rows):
        passed.append(sum(w.numel() * 4 for w in measured_weights))
        return _onednn_wins(measured_weights, rows)

    monkeypatch.setattr(fp32_layout, "measure", recording_measure)
    assert fp32_layout.layout_for(weights, rows=16, new_tokens=100) == "onednn"
    assert len(passed) == 1 and fp32_layout.MEASURE_SAMPLE_BYTES <= passed[0] < 140 << 20


# -- MKL's packed copy of the large weights (the vocabulary projection), measured ------------


@pytest.mark.parametrize(
    ("plain_ms", "packed_ms", "pack_ms", "new_tokens", "expected"),
    [
        (7.2, 3.5, 150.0, 96, True),  # the AMD EPYC at 1 row: 3.7 ms a step x 96 > 150 ms
        (7.2, 3.5, 150.0, 32, False),  # too short a call to win the packing back
        (7.2, 3.5, 150.0, None, True),  # call length unknown: assumed to pay
        (3.4, 3.6, 150.0, 96, False),  # packed no faster (a Xeon at 1 row)
        (7.2, 6.9, 1.0, 96, False),  # under MIN_SAVING: noise decides
    ],
)
def test_mkl_packing_of_large_weights_is_decided_by_measurement(
    monkeypatch, plain_ms, packed_ms, pack_ms, new_tokens, expected
):
    calls: list[int] = []
    monkeypatch.setattr(fp32_layout, "measure_mkl_packing", _fake_measure(plain_ms, packed_ms, pack_ms, calls, "MKL"))
    monkeypatch.setattr(fp32_layout, "MEASURE_MIN_BYTES", 0)
    head = [torch.zeros(96, 64)]
    assert fp32_layout.mkl_packing_pays(head, rows=1, new_tokens=new_tokens) is expected
    assert fp32_layout.mkl_packing_pays(head, rows=1, new_tokens=new_tokens) is expected
    assert calls == [1]  # once per process and row-count class
    fp32_layout.mkl_packing_pays(head, rows=3, new_tokens=new_tokens)
    assert calls == [1, 4]


def test_small_weights_are_not_measured_for_mkl_packing(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(fp32_layout, "measure_mkl_packing", _fake_measure(7.2, 3.5, 1.0, calls, "MKL"))
    assert fp32_layout.mkl_packing_pays([torch.zeros(96, 64)], rows=1, new_tokens=96) is None
    assert fp32_layout.mkl_packing_pays([], rows=1, new_tokens=96) is None
    assert calls == []


@pytest.mark.skipif(not packed_linear._fp32_packing_available(), reason="no MKL packing in this torch build")
def test_a_one_row_call_packs_the_large_weights_where_measured_to_pay(monkeypatch):
    """The fixed rule kept every one-row call plain; a measured win packs the vocabulary
    projection (in MKL's format) for such a call, with the same logits."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "mkl")
    monkeypatch.setattr(packed_linear, "FP32_MIN_WEIGHT_ELEMENTS", 4096)  # the tiny model's head counts as large
    monkeypatch.setattr(fp32_layout, "MEASURE_MIN_BYTES", 0)
    calls: list[int] = []
    monkeypatch.setattr(fp32_layout, "measure_mkl_packing", _fake_measure(7.2, 3.5, 1.0, calls, "MKL"))
    policy = _policy()
    model = policy.model
    assert not packed_linear.packing_pays(1, 96)  # the fixed rule alone: plain
    assert packed_linear.packing_plan(model, rows=1, new_tokens=96).format == packed_linear.FP32_MKL
    monkeypatch.setattr(fp32_layout, "_measured", {})
    monkeypatch.setattr(fp32_layout, "measure_mkl_packing", _fake_measure(3.4, 3.6, 1.0, calls, "MKL"))
    assert packed_linear.packing_plan(model, rows=1, new_tokens=96).format is None
    ids = torch.randint(5, 100, (1, 1))
    monkeypatch.setattr(fp32_layout, "_measured", {})
    monkeypatch.setattr(fp32_layout, "measure_mkl_packing", _fake_measure(7.2, 3.5, 1.0, calls, "MKL"))
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with packed_linear.prepacked_linears(model, rows=1, new_tokens=96) as active:
            assert active
            packed = model(input_ids=ids).logits
    assert torch.allclose(plain, packed, atol=1e-4)


def test_measure_mkl_packing_times_both_ways():
    if not packed_linear._fp32_packing_available():
        pytest.skip("no MKL packing in this torch build")
    found = fp32_layout.measure_mkl_packing([torch.randn(256, 64)], rows=1)
    assert found.rows == 1 and found.packed_as == "MKL"
    assert found.plain_ms > 0 and found.packed_ms > 0 and found.pack_ms > 0
    assert found.verdict in ("MKL-packed", "plain (MKL)")


def test_the_restore_counts_as_a_one_off_cost(monkeypatch):
    """oneDNN's packed copies stand in for the plain weights, which are rebuilt when the call
    ends: a call must win back the packing AND the restore."""
    monkeypatch.setattr(fp32_layout, "MEASURE_MIN_BYTES", 0)

    def measure(weights, rows):  # 33 ms a step saved; 100 ms packing, 150 ms restoring
        return fp32_layout.Measurement(rows, 60.0, 27.0, 100.0, 1.0, 1, "oneDNN", restore_ms=150.0)

    monkeypatch.setattr(fp32_layout, "measure", measure)
    weights = [torch.zeros(8, 8)]
    assert fp32_layout.layout_for(weights, rows=4, new_tokens=6) == "mkl"  # 198 ms < 250 ms
    assert fp32_layout.layout_for(weights, rows=4, new_tokens=8) == "onednn"  # 264 ms >= 250 ms
    assert "restoring 150 ms" in fp32_layout.measured()[0].describe()


@needs_onednn
def test_a_real_oneDNN_measurement_times_the_restore_and_MKL_has_none():
    weights = [torch.randn(96, 64), torch.randn(64, 96)]
    onednn = fp32_layout.measure(weights, rows=4)
    assert onednn.restore_ms > 0 and onednn.one_off_ms == onednn.pack_ms + onednn.restore_ms
    if getattr(torch._C, "has_mkl", False):
        assert fp32_layout.measure_mkl_packing(weights, rows=4).restore_ms == 0.0


@needs_onednn
@pytest.mark.parametrize("fuse", [True, False])
def test_weights_restored_after_an_inference_mode_call_can_still_train(monkeypatch, fuse):
    """A call under ``torch.inference_mode`` releases and restores the plain weights; the
    restored ones must be ordinary tensors, or every later training pass fails."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    monkeypatch.setattr(packed_linear, "FUSE_SIBLINGS", fuse)  # sibling sets and single layers
    policy = _policy()
    before = {name: p.detach().clone() for name, p in policy.model.named_parameters()}
    cfg = GenerationConfig(max_new_tokens=6, temperature=0.0)
    with torch.inference_mode():
        policy.generate(["def add(a, b):", "x y"], 2, cfg, seed=1)
    params = dict(policy.model.named_parameters())
    assert not any(p.is_inference() for p in params.values())
    assert all(torch.equal(params[name].detach(), value) for name, value in before.items())
    logprobs, _ = policy.token_logprobs([[5, 6, 7]], [[8, 9]])
    logprobs.sum().backward()
    assert params["model.layers.0.self_attn.q_proj.weight"].grad is not None
    assert params["model.layers.0.self_attn.o_proj.weight"].grad is not None
