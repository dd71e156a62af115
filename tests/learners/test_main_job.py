"""`comlrl main`: the end-to-end job writes its whole run folder (tiny model, short budget)."""

from __future__ import annotations

import json

from comlrl_core.cli import main as cli_main
from comlrl_core.models.cpu import fp32_layout
from comlrl_core.models.cpu.allocator import loaded_allocator
from comlrl_core.run.metrics import read_metrics


def test_main_job_writes_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("COMLRL_FP32_LAYOUT", raising=False)  # the default: measured where it matters
    monkeypatch.setattr(fp32_layout, "_measured", {})  # as in a fresh process: no other test's measurements
    out = tmp_path / "run"
    rc = cli_main(
        [
            "main",
            "--out",
            str(out),
            "env_kwargs={dataset: humaneval, external_transition: level_feedback, sandbox_backend: process}",
            "magrpo.agent_models=[tiny-random]",
            "magrpo.max_steps=1",
            "magrpo.max_new_tokens=8",
            "eval_num_tasks=1",
            "eval_max_new_tokens=8",
        ]
    )
    assert rc == 0
    for name in ("metrics.jsonl", "reward_curve.png", "eval_components.png", "eval.md", "eval.json", "config.yaml"):
        assert (out / name).is_file(), name
    assert any((out / "checkpoints").iterdir())
    rows = read_metrics(out)
    eval_rows = [{k: v for k, v in r.items() if k.startswith("eval/")} for r in rows if "eval/pass@1" in r]
    assert [r["step"] for r in rows if "eval/pass@1" in r] == [0, 1]  # before and after training
    assert any("turn_1/reward_mean" in r for r in rows)
    table = (out / "eval.md").read_text()
    assert "| eval/pass@1 |" in table and "| eval/turn_2/reward_mean |" in table
    evals = json.loads((out / "eval.json").read_text())
    assert (evals["before"], evals["after"]) == (eval_rows[0], eval_rows[-1]) and 0.0 <= evals["after"][
        "eval/pass@1"
    ] <= 1.0
    # the table's intervals: paired bootstrap of after - before over the held-out problems
    assert "| metric | before | after | difference | 95% CI |" in table and evals["num_episodes"] == 2
    for key in ("eval/return_mean", "eval/test_pass_rate", "eval/pass@1", "eval/cooperation_rate"):
        iv = evals["comparison"][key]
        assert iv["low"] <= iv["difference"] <= iv["high"] and f"| {key} |" in table
    assert evals["seed"] == 7 and evals["command"].startswith("comlrl main --out")
    # wall time and peak memory, with the CPU they were measured on (issue #15's RSS figure)
    assert 0.1 < evals["peak_rss_gib"] < 64 and evals["seconds"] > 0 and evals["cpu"]
    assert f"peak RSS {evals['peak_rss_gib']:.2f} GiB" in table and evals["cpu"] in table
    # ... and the C allocator that served the process (it moves the peak by about 1 GiB)
    assert evals["allocator"] == loaded_allocator() and f"({evals['allocator']} malloc)" in table
    # ... and what decided the fp32 weight layouts its sampling ran in (the suite keeps no
    # record; the tiny model is too small to measure, so there are no measurements)
    assert evals["fp32_layouts"] == ["COMLRL_FP32_LAYOUT_RECORD=off: measured in this process"]
    assert "fp32 weight layouts of the sampling calls:\n- COMLRL_FP32_LAYOUT_RECORD=off" in table
    # the table's "after" column is what `comlrl eval --checkpoint` gives for the run folder
    replay = tmp_path / "replay.json"
    assert cli_main(["eval", "--checkpoint", str(out), "--out", str(replay)]) == 0
    assert json.loads(replay.read_text()) == evals["after"]
    # ... and `comlrl export` turns it into folders that plain transformers loads
    exported = tmp_path / "export"
    assert cli_main(["export", str(out), "--out", str(exported)]) == 0
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(exported / "agent_0").config.model_type == "llama"
    cells = [line.split("|") for line in table.splitlines() if line.startswith("| eval/")]
    after_column = {cell[1].strip(): cell[3].strip() for cell in cells}
    assert after_column and all(after_column[k] == f"{evals['after'][k]:.4f}" for k in after_column)


def test_the_default_job_trains_and_evaluates_on_the_easy_sets_split():
    from envs.code.tasks import EASY_HELD_OUT_SLICE, EASY_TRAIN_SLICE
    from learners.main_job import MainJobConfig

    cfg = MainJobConfig()
    assert cfg.env_kwargs["dataset"] == "easy"
    assert (cfg.magrpo.train_task_slice, cfg.eval_task_slice) == (EASY_TRAIN_SLICE, EASY_HELD_OUT_SLICE)
    # every held-out problem, twice: 72 episodes before and after
    assert (cfg.eval_num_tasks, cfg.eval_n_samples) == (36, 2)


def test_main_job_rejects_a_bad_option(capsys):
    assert cli_main(["main", "eval_n_samples=0"]) == 2
    assert "eval_n_samples" in capsys.readouterr().err
