"""Pre-packed linear weights for CPU decoding (comlrl_core.models.cpu.packed_linear): active where
the backends exist, the same outputs and samples as the plain layers, and nothing left
behind after the block."""

from __future__ import annotations

import pytest
import torch

from comlrl_core.models.cpu import packed_linear
from comlrl_core.models.hf_policy import TransformersPolicy
from comlrl_core.policy import GenerationConfig

PROMPTS = ["def add(a, b):", "Write a story about a team", "x"]


def _policy(mixed: str = "no") -> TransformersPolicy:
    torch.manual_seed(0)
    return TransformersPolicy.from_source("tiny-random", device="cpu", mixed_precision=mixed)


def _autocast(mixed: str):
    return torch.autocast("cpu", dtype=torch.bfloat16) if mixed == "bf16" else torch.autocast("cpu", enabled=False)


def _available(mixed: str) -> bool:
    return packed_linear._bf16_packing_available() if mixed == "bf16" else packed_linear._fp32_packing_available()


@pytest.mark.parametrize("mixed", ["no", "bf16"])
def test_same_logits_as_the_plain_layers(mixed):
    if not _available(mixed):
        pytest.skip("packing backend not in this torch build / CPU")
    policy = _policy(mixed)
    ids = torch.randint(5, policy.model.config.vocab_size, (3, 7))
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
    ids = torch.randint(5, policy.model.config.vocab_size, (2, 5))
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
    ids = torch.randint(5, policy.model.config.vocab_size, (1, 4))
    with torch.no_grad():
        before = policy.model(input_ids=ids).logits
        for p in policy.model.parameters():
            p.mul_(1.5)  # an optimizer step between two generation calls
        with packed_linear.prepacked_linears(policy.model, rows=4):
            after_packed = policy.model(input_ids=ids).logits
        after_plain = policy.model(input_ids=ids).logits
    assert not torch.allclose(before, after_packed)
    assert torch.allclose(after_plain, after_packed, atol=1e-4)
