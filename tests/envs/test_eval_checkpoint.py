"""``comlrl eval --checkpoint RUN_DIR`` replays a run's own evaluation: train one step
with the tiny model (a MAGRPO-family, an actor-critic and a preference learner), then the
CLI prints exactly the run's last ``eval/...`` row of ``metrics.jsonl``."""

from __future__ import annotations

import json

import pytest
import torch

from comlrl_core.cli import main as comlrl_main
from comlrl_core.models.agent_spec import AgentSpec
from comlrl_core.models.team import Team
from comlrl_core.run.metrics import read_metrics

ENV = "comlrl/Writing-v0"
PASSAGES = [
    "The old mill stands by the river and grinds wheat.",
    "A small fox lives near the farm.",
    "The library opens at nine and lends maps.",
    "Rain fell on the hills for three days.",
    "Boats rest in the harbour after the storm.",
]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("writing") / "passages.json"
    path.write_text(json.dumps([{"passage": p} for p in PASSAGES]))
    return str(path)


def _team(lora: bool) -> Team:
    torch.manual_seed(0)
    return Team.from_specs([AgentSpec("tiny-random", device="cpu", lora=lora) for _ in range(2)])


def _common(tmp_path, data_file, **kw) -> dict:
    base = dict(
        max_new_tokens=8,
        temperature=1.0,
        top_p=0.95,
        top_k=0,
        eval_interval=1,
        eval_num_samples=2,
        eval_task_slice="2:",
        train_task_slice=":2",
        eval_episodes_per_task=2,
        eval_k=[1, 2],
        progress_bar=False,
        seed=3,
        output_dir=str(tmp_path / "run"),
        env_kwargs={"data_file": data_file},
    )
    base.update(kw)
    return base


def _eval_rows(run_dir) -> list[dict]:
    rows = [{k: v for k, v in r.items() if k.startswith("eval/")} for r in read_metrics(run_dir / "metrics.jsonl")]
    return [r for r in rows if r]


def _cli_eval(args, tmp_path, capsys) -> dict:
    out = tmp_path / "cli_eval.json"
    assert comlrl_main(["eval", *args, "--out", str(out)]) == 0
    capsys.readouterr()
    return json.loads(out.read_text())


def _train_magrpo(tmp_path, data_file, lora):
    from learners.magrpo import MAGRPOConfig, MAGRPOTrainer

    cfg = MAGRPOConfig(
        **_common(tmp_path, data_file),
        num_generations=2,
        num_turns=2,
        discount=0.9,
        max_steps=1,
        rollout_buffer_size=1,
        save_final_checkpoint=True,
    )
    MAGRPOTrainer(cfg, _team(lora), ENV).train()


def _train_iac(tmp_path, data_file, lora):
    from learners.actor_critic import IACConfig, IACTrainer

    cfg = IACConfig(
        **_common(tmp_path, data_file),
        num_generations=1,
        num_turns=2,
        max_steps=1,
        rollout_buffer_size=1,
        use_separate_critic=False,
        device="cpu",
    )
    IACTrainer(cfg, _team(lora), ENV).train()


def _train_madpo(tmp_path, data_file, lora):
    from learners.madpo import MADPOConfig, MADPOTrainer

    cfg = MADPOConfig(
        **_common(tmp_path, data_file),
        preference_num_candidates=2,
        preference_pairs_per_sample=1,
        num_train_epochs=1,
        train_batch_size=2,
        save_final_checkpoint=True,
    )
    MADPOTrainer(cfg, _team(lora), ENV).train()


@pytest.mark.parametrize(
    "train,lora",
    [(_train_magrpo, True), (_train_iac, False), (_train_madpo, False)],
    ids=["magrpo-lora", "iac-full", "madpo-full"],
)
def test_eval_checkpoint_equals_the_runs_last_eval_row(train, lora, tmp_path, data_file, capsys):
    train(tmp_path, data_file, lora)
    run_dir = tmp_path / "run"
    rows = _eval_rows(run_dir)
    assert len(rows) >= 2  # before the step and after training
    assert rows[-1]["eval/num_tasks"] == 2 and rows[-1]["eval/episodes_per_task"] == 2
    assert _cli_eval(["--checkpoint", str(run_dir)], tmp_path, capsys) == rows[-1]


def test_eval_of_the_base_model_equals_the_runs_step0_row(tmp_path, data_file, capsys):
    """The issue's reproduction: the same model, tasks, seed and sampling given as options
    gives the trainer's step-0 numbers (full weights: the untrained team is the base model)."""
    _train_magrpo(tmp_path, data_file, lora=False)
    first = _eval_rows(tmp_path / "run")[0]
    args = ["--env", ENV, "--model", "tiny-random", "--task-slice=2:", "--num-tasks", "2", "--n-samples", "2"]
    args += ["--k", "1", "2", "--num-turns", "2", "--discount", "0.9", "--seed", "3", "--max-new-tokens", "8"]
    args += ["--temperature", "1.0", "--top-p", "0.95", "--top-k", "0", "--env-kwarg", f"data_file={data_file}"]
    assert _cli_eval(args, tmp_path, capsys) == first


def test_options_override_the_saved_settings_and_say_so(tmp_path, data_file, capsys):
    _train_madpo(tmp_path, data_file, lora=False)
    run_dir = tmp_path / "run"
    out = tmp_path / "o.json"
    assert comlrl_main(["eval", "--checkpoint", str(run_dir), "--num-tasks", "1", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "--num-tasks 1 overrides the run's num_tasks=2" in err
    assert json.loads(out.read_text())["eval/num_tasks"] == 1


def test_checkpoint_errors_are_clear(tmp_path, capsys):
    assert comlrl_main(["eval", "--checkpoint", str(tmp_path)]) == 2
    assert "evaluation.json does not exist" in capsys.readouterr().err
    assert comlrl_main(["eval", "--checkpoint", str(tmp_path), "--model", "tiny-random"]) == 2
    assert "drop --model" in capsys.readouterr().err
