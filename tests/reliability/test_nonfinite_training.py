"""A step that leaves NaN/Inf weights stops the run and keeps the last good checkpoint;
non-finite options never start one."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from reliability_helpers import run_cli, tiny_train_args, write_passages

from comlrl_core.config.options import ConfigError
from comlrl_core.run.checkpoint import checkpoint_path, find_nonfinite_state, load_checkpoint, verify_checkpoint
from learners.actor_critic.ac_config import IACConfig, MAACConfig
from learners.common.nonfinite import NonFiniteGuard, NonFiniteTrainingError, halt_if_nonfinite
from learners.madpo.madpo_config import MADPOConfig
from learners.magrpo import MAGRPOConfig
from learners.marlhf.marlhf_config import MARLHFConfig

CONFIGS = [MAGRPOConfig, IACConfig, MAACConfig, MADPOConfig, MARLHFConfig]


def _float_options(cls) -> list[str]:
    config = cls()
    return [f.name for f in dataclasses.fields(cls) if f.init and isinstance(getattr(config, f.name), float)]


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_every_float_option_must_be_finite(cls, bad):
    names = _float_options(cls)
    assert "agent_learning_rate" in names
    for name in names:
        with pytest.raises(ConfigError, match=f"option '{name}'.*finite|option '{name}'"):
            cls().with_overrides([f"{name}={bad}"])


def test_the_inf_learning_rate_of_the_issue_is_refused():
    with pytest.raises(ConfigError, match="option 'agent_learning_rate' must be a finite number"):
        MAGRPOConfig().with_overrides(["agent_learning_rate=.inf"])
    with pytest.raises(ConfigError, match="option 'env_kwargs.scale' must be a finite number"):
        MAGRPOConfig().with_overrides(["env_kwargs={scale: .nan}"])


def test_halt_names_the_optimizer_and_the_last_good_checkpoint(tmp_path):
    param = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.AdamW([param], lr=0.1)
    halt_if_nonfinite({"agent_0": opt}, 1, tmp_path)  # finite: nothing happens
    with torch.no_grad():
        param[2] = float("inf")
    assert find_nonfinite_state({"agent_0": opt}) is not None
    with pytest.raises(NonFiniteTrainingError, match="after step 3: optimizer 'agent_0'.*no checkpoint was saved"):
        halt_if_nonfinite({"agent_0": opt}, 3, tmp_path)


def test_guard_checks_after_every_optimizer_step_and_only_then(tmp_path):
    param = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.AdamW([param], lr=0.1)
    guard = NonFiniteGuard()
    guard.check({"a": opt}, 0, tmp_path)
    param.grad = torch.ones(4)
    opt.step()
    guard.check({"a": opt}, 1, tmp_path)
    guard.check({"a": opt}, 2, tmp_path)  # no optimizer step since: nothing to scan
    param.grad = torch.tensor([1.0, float("inf"), 1.0, 1.0])
    opt.step()
    with pytest.raises(NonFiniteTrainingError, match="after step 3"):
        guard.check({"a": opt}, 3, tmp_path)


def test_large_finite_weights_are_not_mistaken_for_nonfinite():
    """A sum that overflows is no proof of NaN/Inf: huge but finite weights pass."""
    param = torch.nn.Parameter(torch.full((4,), 3e38))
    opt = torch.optim.AdamW([param], lr=0.1)
    assert find_nonfinite_state({"a": opt}) is None
    with torch.no_grad():
        param[3] = float("nan")
    assert find_nonfinite_state({"a": opt}) == "optimizer 'a': parameter 0 of group 0 holds NaN/Inf"


def test_cli_run_whose_update_overflows_halts_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    """lr=1e39 is finite (float64) but the first AdamW update overflows the fp32 weights.

    With a rollout buffer of two, step 1 only collects (its checkpoint is good) and
    step 2 updates: the run must stop there, without writing checkpoint 2.
    """
    data = write_passages(tmp_path)
    run_dir = tmp_path / "run"
    args = tiny_train_args(run_dir, data, "max_steps=4", "save_steps=1", "agent_learning_rate=1e39")
    args = [a if a != "rollout_buffer_size=1" else "rollout_buffer_size=2" for a in args]
    code, err = run_cli(args, capsys)
    good = checkpoint_path(run_dir / "checkpoints", 1)
    assert code == 1, err
    assert "NonFiniteTrainingError" in err and "after step 2" in err and str(good) in err
    assert "Traceback" not in err
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [good.name]
    verify_checkpoint(good)
    cursor = load_checkpoint(good, restore_rng=False)
    assert cursor["global_step"] == 1


def test_skip_nonfinite_still_skips_a_single_bad_loss(tmp_path, capsys):
    """The skip path for one bad loss is unchanged: NaN returns -> skipped update, run finishes."""
    from learners.magrpo.magrpo_trainer import MAGRPOTrainer

    data = write_passages(tmp_path)
    run_dir = tmp_path / "run"
    args = tiny_train_args(run_dir, data, "max_steps=2", "skip_nonfinite=true")
    real = MAGRPOTrainer._update
    calls = []

    def nan_advantage_once(self, agent, groups, group_count=None):
        if not calls:
            for group in groups:
                group.returns = [float("nan")] * len(group.returns)
        calls.append(agent)
        return real(self, agent, groups, group_count)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(MAGRPOTrainer, "_update", nan_advantage_once)
        code, err = run_cli(args, capsys)
    assert code == 0, err
    rows = (run_dir / "metrics.jsonl").read_text()
    assert '"agent_0/skipped_nonfinite": 1.0' in rows
