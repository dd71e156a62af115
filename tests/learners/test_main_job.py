"""`comlrl main`: the end-to-end job writes its whole run folder (tiny model, short budget)."""

from __future__ import annotations

import json

from comlrl_core.cli import main as cli_main
from comlrl_core.run.metrics import read_metrics


def test_main_job_writes_the_run_folder(tmp_path):
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
    for name in ("metrics.jsonl", "reward_curve.png", "pass_at_k.png", "eval.md", "eval.json", "config.yaml"):
        assert (out / name).is_file(), name
    assert any((out / "checkpoints").iterdir())
    rows = read_metrics(out)
    assert any("eval_before/pass@1" in r for r in rows) and any("eval_after/pass@1" in r for r in rows)
    assert any("turn_1/reward_mean" in r for r in rows)
    table = (out / "eval.md").read_text()
    assert "| pass@1 |" in table and "| turn_2/reward_mean |" in table
    evals = json.loads((out / "eval.json").read_text())
    assert set(evals) == {"before", "after"} and 0.0 <= evals["after"]["pass@1"] <= 1.0


def test_main_job_rejects_a_bad_option(capsys):
    assert cli_main(["main", "eval_n_samples=0"]) == 2
    assert "eval_n_samples" in capsys.readouterr().err
