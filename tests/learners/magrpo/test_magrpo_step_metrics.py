"""TRL-style options on a real run (tiny model): the learning-rate schedule, the per-agent
step metrics (grad_norm, learning_rate, completions/...), save_total_limit, stop strings."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from comlrl_core.models.agent_spec import AgentSpec
from comlrl_core.models.team import Team
from comlrl_core.run.checkpoint import list_checkpoints
from comlrl_core.run.metrics import read_metrics
from learners.magrpo import MAGRPOConfig, MAGRPOTrainer

PASSAGES = ["The old mill stands by the river.", "A small fox lives near the farm."]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("writing") / "passages.json"
    path.write_text(json.dumps([{"passage": p} for p in PASSAGES]))
    return str(path)


def _run(tmp_path, data_file, **kw) -> tuple[MAGRPOTrainer, list[dict]]:
    torch.manual_seed(0)
    team = Team.from_specs([AgentSpec("tiny-random", device="cpu", lora=True, lora_r=2) for _ in range(2)])
    options: dict[str, Any] = dict(
        num_generations=2,
        num_turns=1,
        max_new_tokens=6,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        eval_interval=0,
        progress_bar=False,
        save_final_checkpoint=False,
        rollout_buffer_size=1,
        max_steps=4,
        num_train_epochs=2,
        agent_learning_rate=1e-3,
        output_dir=str(tmp_path / "run"),
        env_kwargs={"data_file": data_file},
    )
    options.update(kw)
    trainer = MAGRPOTrainer(MAGRPOConfig(**options), team, "comlrl/Writing-v0")
    trainer.train()
    trainer.logger.close()
    rows = [r for r in read_metrics(trainer.run_dir) if "turn_1/reward_mean" in r]
    return trainer, rows


def test_schedule_metrics_and_checkpoint_limit(tmp_path, data_file):
    trainer, rows = _run(
        tmp_path, data_file, lr_scheduler_type="linear", warmup_steps=2, save_steps=1, save_total_limit=2
    )
    assert len(rows) == 4
    # linear warm-up over 2 steps, then linear decay to 0 at step 4
    assert [r["agent_0/learning_rate"] for r in rows] == pytest.approx([0.0, 5e-4, 1e-3, 5e-4])
    for agent in (0, 1):
        for row in rows:
            assert row[f"agent_{agent}/grad_norm"] > 0
            assert 1 <= row[f"agent_{agent}/completions/mean_length"] <= 6
            assert 0.0 <= row[f"agent_{agent}/completions/clipped_ratio"] <= 1.0
    # save_steps=1 wrote 4 checkpoints; only the newest 2 are kept
    kept = list_checkpoints(trainer.run_dir / "checkpoints")
    assert [p.name for p in kept] == ["checkpoint-000003", "checkpoint-000004"]


def test_stop_strings_cut_training_completions(tmp_path, data_file):
    # every decoded character is a stop candidate: each completion ends at its first " "
    # or letter, so it is cut short and never clipped
    stops = [" ", *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,<>"]
    trainer, rows = _run(tmp_path, data_file, max_new_tokens=6, stop=stops, max_steps=2)
    assert trainer.generation_config().stop == tuple(stops)
    for row in rows:
        assert row["agent_0/completions/mean_length"] < 6


@pytest.mark.parametrize("level", ["phase", "micro_batch", "never"])
def test_train_releases_memory_after_each_sampling_call_rollout_and_update(tmp_path, data_file, monkeypatch, level):
    import comlrl_core.models.hf_policy as hf_policy
    import learners.common.logprobs as logprobs
    from comlrl_core.models.cpu import memory_stats

    released: list[int] = []
    monkeypatch.setattr(memory_stats, "release_free_memory", lambda: released.append(1) or True)
    calls = {"sampling": 0, "micro_batch": 0}
    sample_tokens, end_of_micro_batch = hf_policy.sample_tokens, logprobs.end_of_micro_batch

    def counted_sampling(*args, **kwargs):
        calls["sampling"] += 1
        return sample_tokens(*args, **kwargs)

    def counted_micro_batch():
        calls["micro_batch"] += 1
        return end_of_micro_batch()

    monkeypatch.setattr(hf_policy, "sample_tokens", counted_sampling)
    monkeypatch.setattr(logprobs, "end_of_micro_batch", counted_micro_batch)
    trainer, rows = _run(tmp_path, data_file, release_freed_memory=level)
    assert trainer.release_memory == level
    assert calls["sampling"] and calls["micro_batch"]
    # after each sampling call, each step's rollout and update (and each micro-batch's backward)
    expected = {
        "never": 0,
        "phase": calls["sampling"] + 2 * len(rows),
        "micro_batch": calls["sampling"] + 2 * len(rows) + calls["micro_batch"],
    }[level]
    assert len(released) == expected
    assert memory_stats.end_of_phase() is False  # nothing outside train()
    assert len(released) == expected
    for row in rows:
        assert 0 < row["memory/rss_gib"] <= row["memory/peak_rss_gib"]
        assert 0 < row["memory/rss_after_rollout_gib"] <= row["memory/peak_rss_gib"]


def test_an_unknown_release_level_names_the_choices():
    from comlrl_core.config.options import ConfigError

    with pytest.raises(ConfigError, match="release_freed_memory.*'never', 'phase', 'micro_batch'.*'phase'"):
        MAGRPOConfig(release_freed_memory="phases")
