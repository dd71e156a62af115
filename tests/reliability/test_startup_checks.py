"""``comlrl train`` finds bad input before it loads a model: one or two lines naming the
option and the fix, exit code 2, no traceback (unless ``--debug``)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from reliability_helpers import run_cli, tiny_train_args, write_passages

import learners.cli
from comlrl_core.cli import main as comlrl_main
from comlrl_core.models.team import Team
from comlrl_core.run.checkpoint import checkpoint_path, save_checkpoint
from learners.common.preflight import PreflightError

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture()
def model_loads(monkeypatch) -> list[str]:
    """Every attempt to build the team (load a model) is recorded and refused."""
    calls: list[str] = []

    def refuse(config, env_id):
        calls.append(env_id)
        raise RuntimeError("the team was built: start-up checks came too late")

    def refuse_specs(cls, agents):
        calls.append("Team.from_specs")
        raise RuntimeError("models were loaded: start-up checks came too late")

    monkeypatch.setattr(learners.cli, "build_team", refuse)
    monkeypatch.setattr(Team, "from_specs", classmethod(refuse_specs))
    return calls


@pytest.fixture()
def data_file(tmp_path) -> str:
    return write_passages(tmp_path)


def _assert_short_usage_error(code: int, err: str, *needles: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert "Traceback" not in err
    assert 1 <= len(lines) <= 2, err
    for needle in needles:
        assert needle in err, (needle, err)


def test_output_dir_that_is_a_file(tmp_path, data_file, capsys, model_loads):
    target = tmp_path / "run"
    target.write_text("not a folder")
    code, err = run_cli(tiny_train_args(target, data_file), capsys)
    _assert_short_usage_error(code, err, "output_dir", "is a file")
    assert model_loads == []


def test_output_dir_under_a_file(tmp_path, data_file, capsys, model_loads):
    (tmp_path / "blocker").write_text("a file where a folder should be")
    code, err = run_cli(tiny_train_args(tmp_path / "blocker" / "run", data_file), capsys)
    _assert_short_usage_error(code, err, "output_dir", "blocker is a file")
    assert model_loads == []


def test_output_dir_read_only(tmp_path, data_file, capsys, model_loads):
    target = tmp_path / "readonly"
    target.mkdir()
    target.chmod(0o555)
    try:
        if os.access(target, os.W_OK):
            pytest.skip("this user writes to read-only folders (root); the immutable case covers it")
        code, err = run_cli(tiny_train_args(target, data_file), capsys)
    finally:
        target.chmod(0o755)
    _assert_short_usage_error(code, err, "output_dir", "not writable")
    assert model_loads == []


def test_output_dir_immutable(tmp_path, data_file, capsys, model_loads):
    target = tmp_path / "immutable"
    target.mkdir()
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(target)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available on this file system")
    try:
        code, err = run_cli(tiny_train_args(target, data_file), capsys)
    finally:
        subprocess.run([chattr, "-i", str(target)], check=True)
    _assert_short_usage_error(code, err, "output_dir", "not writable")
    assert model_loads == []


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ({"env": "comlrl/NoSuchEnv-v0"}, ["unknown environment id 'comlrl/NoSuchEnv-v0'", "--env"]),
        ({"extra": ["agent_models=[./no/such/model]"]}, ["option 'agent_models'", "./no/such/model"]),
        ({"extra": ["agent_models=[not a model!]"]}, ["option 'agent_models'", "not recognised"]),
        ({"env_kwargs": "{{data_file: {data}, no_such_option: 1}}"}, ["option 'env_kwargs'", "no_such_option"]),
        ({"env_kwargs": "{{data_file: {missing}}}"}, ["option 'env_kwargs'", "missing.json"]),
        ({"env_kwargs": "{{data_file: {data}, num_turns: 3}}"}, ["option 'env_kwargs' sets num_turns"]),
        ({"extra": ["lora_alpha=-1"]}, ["option 'lora_alpha'", "> 0"]),
        ({"extra": ["agent_learning_rate=.inf"]}, ["option 'agent_learning_rate'", "finite"]),
        ({"extra": ["num_agents=3"]}, ["option 'num_agents'", "2 agents"]),
    ],
    ids=[
        "env-id",
        "model-path",
        "model-name",
        "env-kwargs",
        "env-data-file",
        "env-kwargs-clash",
        "lora-alpha",
        "inf-lr",
        "num-agents",
    ],
)
def test_bad_input_is_one_or_two_lines_and_exit_2(tmp_path, data_file, capsys, model_loads, change, needles):
    args = tiny_train_args(tmp_path / "run", data_file, *change.get("extra", []))
    if "env" in change:
        args[args.index("--env") + 1] = change["env"]
    if "env_kwargs" in change:
        text = change["env_kwargs"].format(data=data_file, missing=tmp_path / "missing.json")
        args = [a if not a.startswith("env_kwargs=") else f"env_kwargs={text}" for a in args]
    code, err = run_cli(args, capsys)
    _assert_short_usage_error(code, err, *needles)
    assert model_loads == []


def test_resume_with_nothing_to_resume(tmp_path, data_file, capsys, model_loads):
    code, err = run_cli(tiny_train_args(tmp_path / "run", data_file, flags=("--resume",)), capsys)
    _assert_short_usage_error(code, err, "--resume", "no checkpoint to resume", "drop --resume")
    assert model_loads == []


def test_resume_from_a_corrupt_path(tmp_path, data_file, capsys, model_loads):
    ckpt = save_checkpoint(checkpoint_path(tmp_path / "elsewhere", 3), cursor={"algorithm": "MAGRPO"})
    (ckpt / "cursor.json").write_text('{"algorithm": "MAGRPO", "x": 1}')
    code, err = run_cli(tiny_train_args(tmp_path / "run", data_file, flags=("--resume-from", str(ckpt))), capsys)
    _assert_short_usage_error(code, err, "--resume-from", str(ckpt), "cursor.json")
    assert model_loads == []


def test_resume_from_a_missing_path(tmp_path, data_file, capsys, model_loads):
    missing = tmp_path / "nowhere" / "checkpoint-000001"
    code, err = run_cli(tiny_train_args(tmp_path / "run", data_file, flags=("--resume-from", str(missing))), capsys)
    _assert_short_usage_error(code, err, "--resume-from", "no checkpoint at")
    assert model_loads == []


def test_resume_from_another_algorithm(tmp_path, data_file, capsys, model_loads):
    ckpt = save_checkpoint(checkpoint_path(tmp_path / "elsewhere", 3), cursor={"algorithm": "MADPO"})
    code, err = run_cli(tiny_train_args(tmp_path / "run", data_file, flags=("--resume-from", str(ckpt))), capsys)
    _assert_short_usage_error(code, err, "written by MADPO, not MAGRPO")
    assert model_loads == []


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback(tmp_path, data_file, where, model_loads):
    args = tiny_train_args(tmp_path / "run", data_file)
    args[args.index("--env") + 1] = "comlrl/NoSuchEnv-v0"
    args = ["--debug", *args] if where == "before" else [*args[:4], "--debug", *args[4:]]
    with pytest.raises(PreflightError, match="unknown environment id"):
        comlrl_main(args)
    assert model_loads == []


def test_console_shows_no_traceback(tmp_path, data_file):
    """The real console path: a fresh interpreter, exit status 2, no traceback on stderr."""
    args = tiny_train_args(tmp_path / "run", data_file)
    args[args.index("--env") + 1] = "comlrl/NoSuchEnv-v0"
    done = subprocess.run(
        [sys.executable, "-m", "comlrl_core.cli", *args], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) <= 2 and "unknown environment id" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["env_kwargs={dataset: humaneval, sandbox_backend: process, no_such_option: 1}"], ["'env_kwargs'"]),
        (["magrpo.agent_models=[./no/such/model]"], ["option 'magrpo.agent_models'"]),
        (["magrpo.agent_learning_rate=.nan"], ["agent_learning_rate", "finite"]),
        (["eval_task_slice=100000:"], ["option 'eval_task_slice'", "selects no task"]),
    ],
    ids=["env-kwargs", "model", "nan-lr", "eval-slice"],
)
def test_main_job_checks_before_loading(tmp_path, capsys, model_loads, extra, needles):
    code, err = run_cli(["main", "--out", str(tmp_path / "run"), *extra], capsys)
    _assert_short_usage_error(code, err, *needles)
    assert model_loads == []


def test_main_job_out_that_is_a_file(tmp_path, capsys, model_loads):
    (tmp_path / "run").write_text("a file")
    code, err = run_cli(["main", "--out", str(tmp_path / "run")], capsys)
    _assert_short_usage_error(code, err, "'--out'", "is a file")
    assert model_loads == []
