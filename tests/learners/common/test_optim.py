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


# -- TRL-style optimisation options ------------------------------------------------------
def test_adamw_takes_betas_and_epsilon():
    from learners.common.optim import adamw_settings
    from learners.magrpo import MAGRPOConfig

    config = MAGRPOConfig(adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6, weight_decay=0.01)
    opt = adamw([torch.nn.Parameter(torch.ones(3))], lr=1e-3, **adamw_settings(config))
    assert opt.defaults["betas"] == (0.8, 0.95) and opt.defaults["eps"] == 1e-6
    assert opt.defaults["weight_decay"] == 0.01


def test_schedule_follows_transformers_get_scheduler():
    from types import SimpleNamespace

    from learners.common.optim import LearningRateSchedule

    opt = adamw([torch.nn.Parameter(torch.ones(3))], lr=1.0)
    config = SimpleNamespace(lr_scheduler_type="linear", warmup_steps=2, warmup_ratio=0.0)
    schedule = LearningRateSchedule([opt], config, total_steps=6)
    rates = []
    for step in range(6):
        schedule.apply(step)
        rates.append(opt.param_groups[0]["lr"])
    assert rates == pytest.approx([0.0, 0.5, 1.0, 0.75, 0.5, 0.25])
    # warmup_ratio: ceil(0.5 * 4) = 2 warm-up steps; constant becomes constant_with_warmup
    ratio = SimpleNamespace(lr_scheduler_type="constant", warmup_steps=0, warmup_ratio=0.5)
    schedule = LearningRateSchedule([opt], ratio, total_steps=4)
    schedule.apply(1)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5)
    schedule.apply(3)
    assert opt.param_groups[0]["lr"] == pytest.approx(1.0)


def test_grad_norm_is_measured_at_each_step_and_drained():
    from learners.common.optim import drain_optimizer_stats, note_grad_norm

    p = torch.nn.Parameter(torch.zeros(2))
    opt = adamw([p], lr=0.1)
    for grad in ([3.0, 4.0], [0.0, 1.0]):
        p.grad = torch.tensor(grad)
        opt.step()
    stats = drain_optimizer_stats({"agent_0": opt})
    assert stats == {"agent_0/learning_rate": 0.1, "agent_0/grad_norm": pytest.approx(3.0)}  # mean of 5 and 1
    assert "agent_0/grad_norm" not in drain_optimizer_stats({"agent_0": opt})  # no step since
    p.grad = torch.tensor([0.3, 0.4])
    note_grad_norm(opt, 10.0)  # the norm before clipping wins over the clipped gradients
    opt.step()
    assert drain_optimizer_stats({"agent_0": opt})["agent_0/grad_norm"] == 10.0


@pytest.mark.parametrize(
    "override",
    ["lr_scheduler_type=sometimes", "warmup_ratio=1.5", "warmup_steps=-1", "adam_beta1=1.0", "save_total_limit=0"],
)
def test_bad_optimisation_options_are_refused(override):
    from comlrl_core.config.coercion import ConfigError
    from learners.magrpo import MAGRPOConfig

    with pytest.raises(ConfigError, match=override.split("=")[0]):
        MAGRPOConfig().with_overrides([override])
