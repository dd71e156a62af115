"""`comlrl main` writes its metrics through the logging backends of its options (``report_to``)."""

from __future__ import annotations

from comlrl_core.cli import main as cli_main
from comlrl_core.run.metrics import read_metrics


def test_main_job_reports_to_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

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
            "report_to=[tensorboard]",
            "run_name=main-tb",
        ]
    )
    assert rc == 0
    events = EventAccumulator(str(out / "tensorboard" / "main-tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert "turn_1/reward_mean" in tags
    # the held-out evaluation before and after training (its pass@1 key), as in metrics.jsonl
    pass_tags = sorted(t for t in tags if t.endswith("pass@1"))
    assert pass_tags
    rows = read_metrics(out)
    for tag in pass_tags:
        assert [(e.step, e.value) for e in events.Scalars(tag)] == [(r["step"], r[tag]) for r in rows if tag in r]
