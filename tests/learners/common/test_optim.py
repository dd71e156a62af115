"""The learners' AdamW: fused when possible, the same updates as torch's reference one."""

from __future__ import annotations

import pytest
import torch

from learners.common.optim import adamw
from learners.common.options import TeamOptions


def _train(optimizer_factory, steps=5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = optimizer_factory(model.parameters())
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return opt, [p.detach().clone() for p in model.parameters()]


def test_adamw_is_fused_on_cpu_and_matches_the_reference():
    opt, fused = _train(lambda ps: adamw(ps, lr=1e-2, weight_decay=0.1))
    assert opt.defaults["fused"] is True
    _, reference = _train(lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=False))
    _, initial = _train(lambda ps: torch.optim.SGD(ps, lr=0.0), steps=1)
    for a, b, start in zip(fused, reference, initial, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
        assert not torch.allclose(a, start)  # the steps did move the weights


def test_adamw_falls_back_when_a_parameter_cannot_be_fused():
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float32))
    q = torch.nn.Parameter(torch.zeros(3, dtype=torch.int64).float().to(torch.complex64))
    opt = adamw([p, q], lr=1e-3)
    assert not opt.defaults.get("fused")


def test_team_options_validate_precision():
    assert TeamOptions(dtype="bf16").dtype == "bf16"
    with pytest.raises(ValueError, match="'dtype'"):
        TeamOptions(dtype="fp16")
    with pytest.raises(ValueError, match="'mixed_precision'"):
        TeamOptions(mixed_precision="fp8")
    with pytest.raises(ValueError, match="dtype=fp32"):
        TeamOptions(dtype="bf16", mixed_precision="bf16")
