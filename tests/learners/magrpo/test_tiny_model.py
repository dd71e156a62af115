"""End to end on the tiny random model: learning on Writing-v0, exact resume, the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from comlrl_core.cli import main as comlrl_main
from comlrl_core.models.agent_spec import AgentSpec
from comlrl_core.models.team import Team
from learners.magrpo import MAGRPOConfig, MAGRPOTrainer

PASSAGES = [
    "The old mill stands by the river and grinds wheat for the town every autumn.",
    "A small fox lives near the farm and hunts mice in the tall grass at night.",
    "The library opens at nine and lends books, maps and records to every visitor.",
    "Rain fell on the hills for three days and the streams rose over the stones.",
]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    # Short passages keep prompts short, so the tiny model runs fast on CPU.
    path = tmp_path_factory.mktemp("writing") / "passages.json"
    path.write_text(json.dumps([{"passage": p} for p in PASSAGES]))
    return str(path)


def _team(lora: bool = False) -> Team:
    torch.manual_seed(0)  # LoRA adapters start random: every team starts the same
    return Team.from_specs([AgentSpec("tiny-random", device="cpu", lora=lora) for _ in range(2)])


def _config(tmp_path, data_file, **kw) -> MAGRPOConfig:
    base = dict(
        num_generations=4,
        num_turns=1,
        max_new_tokens=16,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        eval_interval=0,
        progress_bar=False,
        save_final_checkpoint=False,
        seed=0,
        rollout_buffer_size=1,
        num_train_epochs=100,
        output_dir=str(tmp_path / "run"),
        env_kwargs={"data_file": data_file},
    )
    base.update(kw)
    return MAGRPOConfig(**base)


def test_magrpo_learns_on_writing(tmp_path, data_file):
    torch.manual_seed(0)
    config = _config(tmp_path, data_file, max_steps=24, agent_learning_rate=3e-3, eval_interval=24, eval_num_samples=4)
    trainer = MAGRPOTrainer(config, _team(), "comlrl/Writing-v0")
    trainer.train()
    rewards = [h["turn_1/reward_mean"] for h in trainer.history if "turn_1/reward_mean" in h]
    assert len(rewards) == 24
    start, end = sum(rewards[:6]) / 6, sum(rewards[-6:]) / 6
    assert end > start + 0.05, (start, end, rewards)
    evals = [h for h in trainer.history if "eval/turn_1/reward_mean" in h]
    assert [int(h["step"]) for h in evals] == [0, 24]  # before step 0 and at the end


def _params(team: Team) -> list[torch.Tensor]:
    return [p.detach().clone() for policy in team for p in policy.parameters()]


@pytest.mark.parametrize("lora", [False, True])
def test_resume_equals_uninterrupted_on_tiny_model(tmp_path, data_file, lora):
    kw = dict(
        max_steps=4,
        rollout_buffer_size=3,
        num_generations=2,
        max_new_tokens=8,
        agent_learning_rate=1e-2 if lora else 1e-3,
    )
    straight_team = _team(lora)
    MAGRPOTrainer(_config(tmp_path / "a", data_file, **kw), straight_team, "comlrl/Writing-v0").train()

    first = MAGRPOTrainer(_config(tmp_path / "b", data_file, **kw), _team(lora), "comlrl/Writing-v0")
    first.train(stop_after=2)
    first.save_checkpoint()
    assert len(first.buffers[0]) == 2  # a buffer that crosses the checkpoint

    resumed_team = _team(lora)
    resumed = MAGRPOTrainer(_config(tmp_path / "b", data_file, **kw), resumed_team, "comlrl/Writing-v0")
    resumed.resume_from_checkpoint()
    resumed.train()
    start = _params(_team(lora))
    for a, b, _ in zip(_params(straight_team), _params(resumed_team), start, strict=True):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, s) for a, s in zip(_params(straight_team), start, strict=True))


def test_cli_trains_logs_plots_and_resumes(tmp_path, data_file, capsys):
    out = tmp_path / "cli-run"
    args = [
        "train",
        "marloo",
        "--env",
        "comlrl/Writing-v0",
        f"output_dir={out}",
        "num_turns=2",
        "num_generations=2",
        "max_new_tokens=6",
        "max_steps=2",
        "eval_interval=0",
        "device=cpu",
        "agent_models=[tiny-random]",
        f"env_kwargs={{data_file: {data_file}}}",
    ]
    assert comlrl_main(args) == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    assert {"turn_1/reward_mean", "turn_2/reward_mean", "agent_0/loss"} <= set(lines[-1])
    assert (out / "reward_curve.png").stat().st_size > 0
    assert (out / "checkpoints" / "checkpoint-000002").is_dir()
    resume = args[:4] + ["--resume"] + [a if a != "max_steps=2" else "max_steps=3" for a in args[4:]]
    assert comlrl_main(resume) == 0
    assert "resumed from" in capsys.readouterr().err
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]


def test_cli_rejects_a_bad_option(capsys):
    assert comlrl_main(["train", "magrpo", "--env", "comlrl/Writing-v0", "joint_mode=crossed"]) == 2
    assert "joint_mode" in capsys.readouterr().err
