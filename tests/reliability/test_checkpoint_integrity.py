"""Checkpoints: a damaged newest checkpoint stops a resume (or is skipped only when asked,
saying so), is never overwritten, and a killed save's leftovers are tidied at start-up."""

from __future__ import annotations

import os

import pytest
import torch
from reliability_helpers import flip_a_byte, metric_steps, run_cli, tiny_train_args, write_passages

from comlrl_core.run.checkpoint import (
    CheckpointError,
    NoCheckpointError,
    NonFiniteStateError,
    checkpoint_path,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from comlrl_core.run.checkpoint_recovery import find_resume_checkpoint, recover_leftovers


class Holder:
    """A savable object: one tensor written to one file."""

    def __init__(self, value: float) -> None:
        self.tensor = torch.full((64,), value)

    def save(self, directory: str) -> None:
        torch.save(self.tensor, os.path.join(directory, "t.pt"))

    def load(self, directory: str) -> None:
        self.tensor = torch.load(os.path.join(directory, "t.pt"), weights_only=True)


def _save(root, step: int, value: float = 1.0):
    return save_checkpoint(checkpoint_path(root, step), policies={"p": Holder(value)}, cursor={"step": step})


# -- the library ------------------------------------------------------------------------------


def test_resume_stops_at_a_corrupt_newest_checkpoint(tmp_path):
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    flip_a_byte(newest)
    with pytest.raises(CheckpointError, match="checkpoint-000002.*corrupt"):
        find_resume_checkpoint(tmp_path)


def test_skip_corrupt_falls_back_and_names_what_it_skipped(tmp_path):
    good = _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    flip_a_byte(newest)
    path, skipped = find_resume_checkpoint(tmp_path, skip_corrupt=True)
    assert path == good
    assert [p for p, _ in skipped] == [newest] and "sha256" in skipped[0][1]


def test_every_checkpoint_corrupt_says_so(tmp_path):
    for step in (1, 2):
        flip_a_byte(_save(tmp_path, step))
    with pytest.raises(
        CheckpointError, match=r"every checkpoint .* is damaged \(checkpoint-000002, checkpoint-000001\)"
    ):
        find_resume_checkpoint(tmp_path, skip_corrupt=True)
    with pytest.raises(CheckpointError, match="checkpoint-000002 is corrupt"):
        find_resume_checkpoint(tmp_path)


def test_no_checkpoint_is_its_own_error(tmp_path):
    with pytest.raises(NoCheckpointError, match="no checkpoint to resume"):
        find_resume_checkpoint(tmp_path)


def test_a_save_never_overwrites_a_corrupt_checkpoint(tmp_path):
    damaged = _save(tmp_path, 5, value=1.0)
    flipped = flip_a_byte(damaged)
    evidence = flipped.read_bytes()
    _save(tmp_path, 5, value=2.0)
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("checkpoint-000005.corrupt-")]
    assert len(kept) == 1
    assert (kept[0] / flipped.relative_to(damaged)).read_bytes() == evidence
    fresh = Holder(0.0)
    load_checkpoint(damaged, policies={"p": fresh}, restore_rng=False)
    assert torch.equal(fresh.tensor, torch.full((64,), 2.0))


def test_a_save_of_nonfinite_optimizer_state_is_refused(tmp_path):
    param = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([param], lr=0.1)
    param.grad = torch.ones(3)
    opt.step()
    good = save_checkpoint(checkpoint_path(tmp_path, 1), optimizers={"a": opt}, cursor={})
    with torch.no_grad():
        param[1] = float("nan")
    with pytest.raises(NonFiniteStateError, match="optimizer 'a'"):
        save_checkpoint(checkpoint_path(tmp_path, 2), optimizers={"a": opt}, cursor={})
    with torch.no_grad():
        param[1] = 1.0
    opt.state[param]["exp_avg_sq"][0] = float("inf")
    with pytest.raises(NonFiniteStateError, match="exp_avg_sq"):
        save_checkpoint(checkpoint_path(tmp_path, 2), optimizers={"a": opt}, cursor={})
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.name]


def test_startup_tidy_removes_tmp_and_restores_an_intact_old_copy(tmp_path):
    kept = _save(tmp_path, 1)
    aside = tmp_path / "checkpoint-000002.old-0badf00d"
    os.replace(_save(tmp_path, 2), aside)  # killed between moving aside and installing
    tmp = tmp_path / "checkpoint-000003.tmp-deadbeef"
    tmp.mkdir()
    (tmp / "half.bin").write_bytes(b"x" * 10)
    report = recover_leftovers(tmp_path)
    assert report["restored"] == [checkpoint_path(tmp_path, 2)] and report["removed"] == [tmp]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-000001", "checkpoint-000002"]
    verify_checkpoint(checkpoint_path(tmp_path, 2))
    assert kept.exists()


def test_startup_tidy_keeps_an_old_copy_when_the_installed_one_is_damaged(tmp_path):
    installed = _save(tmp_path, 2, value=2.0)
    aside = tmp_path / "checkpoint-000002.old-0badf00d"
    os.replace(_save(tmp_path / "other", 2, value=1.0), aside)
    flip_a_byte(installed)
    report = recover_leftovers(tmp_path)
    assert report["kept"] == [aside] and aside.exists() and installed.exists()


# -- the command line -----------------------------------------------------------------------------


@pytest.fixture()
def trained(tmp_path, capsys):
    """A two-step tiny run with a checkpoint after each step."""
    data = write_passages(tmp_path)
    run_dir = tmp_path / "run"
    code, err = run_cli(tiny_train_args(run_dir, data, "max_steps=2", "save_steps=1"), capsys)
    assert code == 0, err
    return run_dir, data


def test_cli_resume_names_a_corrupt_checkpoint_and_keeps_it(trained, capsys):
    run_dir, data = trained
    newest = checkpoint_path(run_dir / "checkpoints", 2)
    flipped = flip_a_byte(newest)
    evidence = flipped.read_bytes()
    code, err = run_cli(tiny_train_args(run_dir, data, "max_steps=3", "save_steps=1", flags=("--resume",)), capsys)
    assert code == 2 and "Traceback" not in err
    assert str(newest) in err and "corrupt" in err and "--resume-skip-corrupt" in err
    assert len(err.strip().splitlines()) <= 2
    assert flipped.read_bytes() == evidence  # untouched


def test_cli_skip_corrupt_falls_back_says_so_and_never_overwrites(trained, capsys):
    run_dir, data = trained
    newest = checkpoint_path(run_dir / "checkpoints", 2)
    flipped = flip_a_byte(newest)
    evidence = flipped.read_bytes()
    args = tiny_train_args(run_dir, data, "max_steps=2", "save_steps=1", flags=("--resume-skip-corrupt",))
    code, err = run_cli(args, capsys)
    assert code == 0, err
    assert f"skipping {newest}" in err and "resumed from" in err and "checkpoint-000001" in err
    kept = [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("checkpoint-000002.corrupt-")]
    assert len(kept) == 1 and (kept[0] / flipped.relative_to(newest)).read_bytes() == evidence
    verify_checkpoint(newest)  # the re-run step 2 wrote a fresh, intact one
    assert metric_steps(run_dir) == [1, 2]  # step 2's row was replaced, not duplicated


def test_cli_all_corrupt_says_corrupt(trained, capsys):
    run_dir, data = trained
    for step in (1, 2):
        flip_a_byte(checkpoint_path(run_dir / "checkpoints", step))
    args = tiny_train_args(run_dir, data, "max_steps=2", flags=("--resume-skip-corrupt",))
    code, err = run_cli(args, capsys)
    assert code == 2 and "every checkpoint" in err and "damaged" in err
    assert "no complete checkpoint" not in err


def test_cli_start_restores_an_intact_old_copy_and_resumes_from_it(trained, capsys):
    run_dir, data = trained
    root = run_dir / "checkpoints"
    newest = checkpoint_path(root, 2)
    os.replace(newest, root / "checkpoint-000002.old-0badf00d")  # killed mid-save of step 2
    (root / "checkpoint-000002.tmp-deadbeef").mkdir()
    code, err = run_cli(tiny_train_args(run_dir, data, "max_steps=3", "save_steps=1", flags=("--resume",)), capsys)
    assert code == 0, err
    assert f"resumed from {newest} at step 2" in err
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-000001", "checkpoint-000002", "checkpoint-000003"]
    assert metric_steps(run_dir) == [1, 2, 3]
