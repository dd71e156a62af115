"""Pre-packed linear weights for CPU decoding (comlrl_core.models.cpu.packed_linear): active where
the backends exist, the same outputs and samples as the plain layers, and nothing left
behind after the block."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from onednn_marks import needs_onednn

from comlrl_core.models.cpu import fp32_layout, model_walk, packed_linear
from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.policy import GenerationConfig

PROMPTS = ["def add(a, b):", "Write a story about a team", "x"]
FP32_DEFAULT_MIN_ELEMENTS = packed_linear.FP32_MIN_WEIGHT_ELEMENTS


@pytest.fixture(autouse=True)
def pack_every_fp32_layer(monkeypatch):
    """The tiny model's weights are all below the fp32 size rule: these tests exercise the
    packed path itself, so every layer packs (the rule has its own test)."""
    monkeypatch.setattr(packed_linear, "FP32_MIN_WEIGHT_ELEMENTS", packed_linear._MIN_WEIGHT_ELEMENTS)
    # and the tests' short calls pack too (the call-size rule has its own test)
    monkeypatch.setattr(packed_linear, "MIN_PACKED_ROWS", 1)
    monkeypatch.setattr(packed_linear, "MIN_PACKED_ROW_TOKENS", 1)


def _policy(mixed: str = "no") -> TransformersPolicy:
    torch.manual_seed(0)
    return TransformersPolicy.from_source("tiny-random", device="cpu", mixed_precision=mixed)


def _vocab(policy: TransformersPolicy) -> int:
    config: Any = policy.model.config  # a transformers config (typed loosely by nn.Module)
    return int(config.vocab_size)


def _autocast(mixed: str):
    return torch.autocast("cpu", dtype=torch.bfloat16) if mixed == "bf16" else torch.autocast("cpu", enabled=False)


def _available(mixed: str) -> bool:
    return packed_linear._bf16_packing_available() if mixed == "bf16" else packed_linear._fp32_packing_available()


@pytest.mark.parametrize("mixed", ["no", "bf16"])
def test_same_logits_as_the_plain_layers(mixed):
    if not _available(mixed):
        pytest.skip("packing backend not in this torch build / CPU")
    policy = _policy(mixed)
    ids = torch.randint(5, _vocab(policy), (3, 7))
    with torch.no_grad(), _autocast(mixed):
        plain = policy.model(input_ids=ids).logits.float()
        with packed_linear.prepacked_linears(policy.model, rows=3 * 7) as active:
            packed = policy.model(input_ids=ids).logits.float()
    assert active
    assert torch.allclose(plain, packed, atol=1e-4 if mixed == "no" else 2e-2)


@pytest.mark.parametrize("mixed", ["no", "bf16"])
def test_generation_samples_are_unchanged(mixed, monkeypatch):
    policy = _policy(mixed)
    cfg = GenerationConfig(max_new_tokens=8, temperature=0.0)
    with_packing = policy.generate(PROMPTS, num_samples=2, generation_config=cfg)
    monkeypatch.setattr(packed_linear, "packing_dtype", lambda model: None)
    without = policy.generate(PROMPTS, num_samples=2, generation_config=cfg)
    assert [[c.token_ids for c in row] for row in with_packing] == [[c.token_ids for c in row] for row in without]


def test_gradient_passes_use_the_plain_layers_and_the_block_cleans_up():
    if not _available("no"):
        pytest.skip("MKL packing not in this torch build")
    policy = _policy()
    layer = next(m for m in policy.model.modules() if isinstance(m, torch.nn.Linear))
    ids = torch.randint(5, _vocab(policy), (2, 5))
    with packed_linear.prepacked_linears(policy.model, rows=2) as active:
        assert active and "forward" in layer.__dict__
        loss = policy.model(input_ids=ids).logits.float().logsumexp(-1).mean()
        loss.backward()  # autograd saw the plain layers
    assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()
    assert "forward" not in layer.__dict__  # the class forward again


def test_packs_the_weights_as_they_are_when_the_block_opens():
    if not _available("no"):
        pytest.skip("MKL packing not in this torch build")
    policy = _policy()
    ids = torch.randint(5, _vocab(policy), (1, 4))
    with torch.no_grad():
        before = policy.model(input_ids=ids).logits
        for p in policy.model.parameters():
            p.mul_(1.5)  # an optimizer step between two generation calls
        with packed_linear.prepacked_linears(policy.model, rows=4):
            after_packed = policy.model(input_ids=ids).logits
        after_plain = policy.model(input_ids=ids).logits
    assert not torch.allclose(before, after_packed)
    assert torch.allclose(after_plain, after_packed, atol=1e-4)


def test_fp32_packs_only_the_large_weights_and_bf16_packs_every_layer(monkeypatch):
    monkeypatch.setattr(packed_linear, "FP32_MIN_WEIGHT_ELEMENTS", FP32_DEFAULT_MIN_ELEMENTS)
    vocab = FP32_DEFAULT_MIN_ELEMENTS // 64 + 1  # a vocabulary projection just over the rule
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, vocab))
    x = torch.randn(3, 64)
    for mixed, expected in (("no", [False, True]), ("bf16", [True, True])):
        if not _available(mixed):
            continue
        with torch.no_grad(), _autocast(mixed), packed_linear.prepacked_linears(model, rows=3) as active:
            assert active and ["forward" in layer.__dict__ for layer in model] == expected
            packed = model(x).float()
        assert torch.allclose(packed, model(x).float(), atol=1e-4 if mixed == "no" else 5e-2)


# -- probes, fallbacks and other people's hooks ---------------------------------------------


@pytest.fixture
def fresh_probes():
    """Each test probes afresh and leaves no switched-off path behind."""
    packed_linear.unavailable_reason.cache_clear()
    packed_linear._broken.clear()
    yield
    packed_linear.unavailable_reason.cache_clear()
    packed_linear._broken.clear()


def _private_op(mixed: str) -> tuple[object, str]:
    return (torch.ops.mkldnn, "_reorder_linear_weight") if mixed == "bf16" else (torch.ops.mkl, "_mkl_linear")


def _raising(*args, **kwargs):
    raise RuntimeError("private op changed its schema")


def _samples(policy: TransformersPolicy) -> list[list[list[int]]]:
    cfg = GenerationConfig(max_new_tokens=8, temperature=0.0)
    return [[c.token_ids for c in row] for row in policy.generate(PROMPTS, num_samples=2, generation_config=cfg)]


@pytest.mark.parametrize("mixed", ["no", "bf16"])
def test_a_failing_probe_keeps_the_plain_layers_and_says_why(mixed, fresh_probes, monkeypatch, caplog):
    if not _available(mixed):
        pytest.skip("packing backend not in this torch build / CPU")
    policy = _policy(mixed)
    expected = _samples(policy)
    packed_linear.unavailable_reason.cache_clear()
    monkeypatch.setattr(*_private_op(mixed), _raising)
    with caplog.at_level("INFO", logger=packed_linear.__name__):
        assert not _available(mixed)
        with _autocast(mixed), packed_linear.prepacked_linears(policy.model, rows=6) as active:
            assert not active
        assert _samples(policy) == expected
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1  # probed once, however often packing is asked for
    assert "linear weights are off" in messages[0] and "private op changed its schema" in messages[0]


def test_an_op_failing_while_decoding_switches_packing_off(fresh_probes, monkeypatch, caplog):
    if not _available("no"):
        pytest.skip("MKL packing not in this torch build")
    policy = _policy()
    expected = _samples(policy)
    monkeypatch.setattr(torch.ops.mkl, "_mkl_linear", _raising)  # the probe passed before this
    with caplog.at_level("WARNING", logger=packed_linear.__name__):
        assert _samples(policy) == expected  # every failed call went to the plain layer
        assert _samples(policy) == expected
    assert packed_linear.FP32_MKL in packed_linear._broken
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "off from now on" in warnings[0]
    with packed_linear.prepacked_linears(policy.model, rows=6) as active:
        assert not active


def test_a_packing_failure_on_the_model_leaves_no_layer_patched(fresh_probes, monkeypatch, caplog):
    if not _available("no"):
        pytest.skip("MKL packing not in this torch build")
    policy = _policy()
    calls = []

    def fail_on_third(weight, rows):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("cannot pack this weight")
        return real(weight, rows)

    real = torch.ops.mkl._mkl_reorder_linear_weight
    monkeypatch.setattr(torch.ops.mkl, "_mkl_reorder_linear_weight", fail_on_third)
    with caplog.at_level("WARNING", logger=packed_linear.__name__):
        with packed_linear.prepacked_linears(policy.model, rows=6) as active:
            assert not active
            linears = [m for m in policy.model.modules() if isinstance(m, torch.nn.Linear)]
            assert linears and not any("forward" in m.__dict__ for m in linears)
    assert "cannot pack this weight" in caplog.text


def test_layers_with_an_accelerate_hook_keep_it(fresh_probes):
    if not _available("no"):
        pytest.skip("MKL packing not in this torch build")
    from accelerate.hooks import ModelHook, add_hook_to_module

    class CountingHook(ModelHook):
        calls = 0

        def pre_forward(self, module, *args, **kwargs):
            CountingHook.calls += 1
            return args, kwargs

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
    add_hook_to_module(model[0], CountingHook())
    hooked_forward = model[0].forward
    x = torch.randn(3, 64)
    with torch.no_grad():
        plain = model(x)
        with packed_linear.prepacked_linears(model, rows=3) as active:
            assert active  # the layer without a hook is packed
            assert isinstance(model[1].__dict__["forward"], packed_linear._PackedForward)
            assert model[0].__dict__["forward"] is hooked_forward
            packed = model(x)
    assert model[0].__dict__["forward"] is hooked_forward and hasattr(model[0], "_hf_hook")
    assert torch.allclose(plain, packed, atol=1e-5)
    calls = CountingHook.calls
    with torch.no_grad():
        model(x)
    assert CountingHook.calls == calls + 1  # the hook still runs after the block


@pytest.mark.parametrize("mixed", ["no", "bf16"])
def test_the_probes_agree_inside_and_outside_autocast(mixed, fresh_probes):
    outside = _available(mixed)
    packed_linear.unavailable_reason.cache_clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert _available(mixed) == outside


def test_short_or_narrow_calls_keep_the_plain_layers(monkeypatch):
    """Packing costs a pass over the weights once per call: a call of one row, or of too few
    tokens in all, decodes on the plain layers; a call where it pays packs."""
    if not _available("no"):
        pytest.skip("MKL packing not in this torch build")
    monkeypatch.setattr(packed_linear, "MIN_PACKED_ROWS", 4)
    monkeypatch.setattr(packed_linear, "MIN_PACKED_ROW_TOKENS", 1024)
    assert not packed_linear.packing_pays(1, 100_000)
    assert not packed_linear.packing_pays(16, 63)
    assert packed_linear.packing_pays(16, 64) and packed_linear.packing_pays(4, 256)
    policy = _policy()
    layer = next(m for m in policy.model.modules() if isinstance(m, torch.nn.Linear))
    with packed_linear.prepacked_linears(policy.model, 1, 4096) as active:
        assert not active and "forward" not in layer.__dict__
    with packed_linear.prepacked_linears(policy.model, 16, 64) as active:
        assert active and "forward" in layer.__dict__


@needs_onednn
def test_a_call_walks_the_models_modules_once(lora_team, monkeypatch):
    """The plan (the format, the sibling sets, the weights the layout is measured on) and
    the layers' wrapping share one list of the team's modules and one count of its shared
    weights: each walk of a LoRA team's ~3,000 modules costs milliseconds a call."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    model = lora_team[0].model
    walks: list[str] = []
    real_named, real_tree = torch.nn.Module.named_modules, model_walk.module_tree

    def counted(self, *args, **kwargs):
        if self is model:  # nn.Module's walks start here (modules(), named_parameters())
            walks.append("named_modules")
        return real_named(self, *args, **kwargs)

    def counted_tree(root):
        walks.append("module_tree")
        return real_tree(root)

    monkeypatch.setattr(torch.nn.Module, "named_modules", counted)
    monkeypatch.setattr(model_walk, "module_tree", counted_tree)
    checked: list[torch.nn.Module] = []
    real_packable = packed_linear._packable

    def counted_packable(module, packed_format):
        checked.append(module)
        return real_packable(module, packed_format)

    monkeypatch.setattr(packed_linear, "_packable", counted_packable)
    with torch.no_grad(), packed_linear.prepacked_linears(model, rows=4, new_tokens=64) as active:
        assert active
    # the dtype probe (its first parameter only), then one walk for the modules and the weights' uses
    assert walks == ["named_modules", "module_tree"]
    # each plain linear layer's packability decided once (the plan and the wrapping both
    # ask), and no other module's (only plain linear layers pack)
    linears = {id(m) for m in model.modules() if type(m) is torch.nn.Linear}
    assert len(checked) == len(linears) and {id(m) for m in checked} == linears


@needs_onednn
def test_one_position_passes_inside_a_prompt_pass_pack_nothing(monkeypatch):
    """A prompt pass may feed part of the model one position per row (the last layer's MLP
    on the last position): inside ``prompt_pass()`` that runs plain and packs nothing; the
    same pass outside it is a decoding pass and packs; nested blocks unwind."""
    monkeypatch.setenv(fp32_layout.ENV_VAR, "onednn")
    policy = _policy()
    packs: list[tuple[int, ...]] = []
    real_pack = fp32_layout.onednn_pack
    monkeypatch.setattr(fp32_layout, "onednn_pack", lambda w, rows: packs.append(tuple(w.shape)) or real_pack(w, rows))
    mlp = policy.model.model.layers[-1].mlp
    x = torch.randn(2, 1, policy.model.config.hidden_size)
    with torch.no_grad(), packed_linear.prepacked_linears(policy.model, rows=2, new_tokens=64) as active:
        assert active
        with packed_linear.prompt_pass(), packed_linear.prompt_pass():
            plain = mlp(x)
        assert packs == []
        assert torch.allclose(mlp(x), plain, atol=1e-5)  # a decoding pass: packed now, same values
    assert len(packs) >= 1 and getattr(packed_linear._prompt_passes, "depth", 0) == 0
