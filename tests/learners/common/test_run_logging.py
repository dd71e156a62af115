"""``report_to`` / ``run_name`` / ``project``: TensorBoard and W&B written from config, by rank 0 only."""

from __future__ import annotations

import pathlib
import time

import pytest

from comlrl_core.config.options import ConfigError
from comlrl_core.run.metrics import read_metrics
from learners.catalog import ALGORITHMS, learner_classes
from learners.common import run_logging
from learners.common.distributed import NullLogger
from learners.magrpo import MAGRPOConfig, MAGRPOTrainer

ROWS = [{"prompt": f"Name a colour, number {i}."} for i in range(4)]


def _reward(completions1, completions2, batch_items=None):
    return [min(len(a), 20) / 20 for a, _ in zip(completions1, completions2, strict=True)]


def _magrpo(tmp_path: pathlib.Path, **options) -> MAGRPOTrainer:
    config = MAGRPOConfig(
        num_generations=2,
        num_turns=1,
        max_new_tokens=4,
        max_steps=2,
        rollout_buffer_size=1,
        eval_interval=0,
        progress_bar=False,
        save_final_checkpoint=False,
        output_dir=str(tmp_path / "run"),
        **options,
    )
    return MAGRPOTrainer.from_components(
        agent_model="tiny-random", train_dataset=ROWS, reward_func=_reward, args=config
    )


def _scalars(folder: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_event_file_reads_back(tmp_path):
    trainer = _magrpo(tmp_path, report_to=["tensorboard"], run_name="exp-1")
    trainer.train()
    trainer.logger.close()
    run = tmp_path / "run"
    scalars = _scalars(run / "tensorboard" / "exp-1")
    rows = [r for r in read_metrics(run) if "turn_1/reward_mean" in r]
    assert len(rows) == 2
    assert scalars["turn_1/reward_mean"] == [(r["step"], pytest.approx(r["turn_1/reward_mean"])) for r in rows]
    assert "agent_0/loss" in scalars


def _wandb_records(path: pathlib.Path) -> list:
    """The records of an offline ``run-*.wandb`` file (a LevelDB-style log after a 7-byte header)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B transaction log"
    pos, chunks, pending, block = 7, [], b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if pos + 7 + length > len(data):  # a record still being written
            break
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:  # full record
            chunks.append(chunk)
        elif kind == 2:  # first fragment
            pending = chunk
        elif kind == 3:  # middle fragment
            pending += chunk
        elif kind == 4:  # last fragment
            chunks.append(pending + chunk)
    records = []
    for chunk in chunks:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(chunk)
        records.append(record)
    return records


def test_wandb_offline_run_reads_back(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the 'wandb' extra is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    trainer = _magrpo(tmp_path, report_to="wandb", run_name="offline-run", project="comlrl-tests")
    trainer.train()
    trainer.logger.close()
    files = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    # W&B's core process writes the file after finish() returns: wait for its exit record.
    deadline = time.monotonic() + 60
    records = _wandb_records(files[0])
    while not any(r.WhichOneof("record_type") == "exit" for r in records):
        assert time.monotonic() < deadline, "the offline W&B run file never got its exit record"
        time.sleep(0.1)
        records = _wandb_records(files[0])
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (runs[0].display_name, runs[0].project) == ("offline-run", "comlrl-tests")
    logged = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): item.value_json for item in r.history.item}
            if "turn_1/reward_mean" in items:
                logged.append((int(items["_step"]), float(items["turn_1/reward_mean"])))
    expected = [
        (r["step"], r["turn_1/reward_mean"]) for r in read_metrics(tmp_path / "run") if "turn_1/reward_mean" in r
    ]
    assert logged == [(s, pytest.approx(v)) for s, v in expected] and len(logged) == 2


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_every_trainer_logs_to_the_report_to_backends(tmp_path, algorithm):
    config_cls, trainer_cls = learner_classes(algorithm)
    trainer = trainer_cls.from_components(
        agent_model="tiny-random",
        train_dataset=ROWS,
        reward_func=_reward,
        args=config_cls(output_dir=str(tmp_path / "run"), report_to=["tensorboard"]),
    )
    trainer._log({"probe/value": 1.5})
    trainer.logger.close()
    assert _scalars(tmp_path / "run" / "tensorboard")["probe/value"] == [(0, 1.5)]
    assert read_metrics(tmp_path / "run")[-1]["probe/value"] == 1.5


@pytest.mark.parametrize("algorithm", ["magrpo", "iac", "madpo", "marlhf"])
def test_a_process_whose_rank_is_not_zero_writes_no_files(tmp_path, monkeypatch, algorithm):
    config_cls, trainer_cls = learner_classes(algorithm)
    monkeypatch.setenv("RANK", "1")
    trainer = trainer_cls.from_components(
        agent_model="tiny-random",
        train_dataset=ROWS,
        reward_func=_reward,
        args=config_cls(output_dir=str(tmp_path / "run"), report_to=["tensorboard"]),
    )
    trainer._log({"probe/value": 1.5})
    assert isinstance(trainer.logger, NullLogger)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_rank_zero_training_run_writes_and_rank_one_does_not(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    _magrpo(tmp_path, report_to=["tensorboard"]).train()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    monkeypatch.setenv("RANK", "0")
    _magrpo(tmp_path, report_to=["tensorboard"]).train()
    assert len([r for r in read_metrics(tmp_path / "run") if "turn_1/reward_mean" in r]) == 2


def test_a_missing_backend_package_fails_at_construction(tmp_path, monkeypatch):
    monkeypatch.setitem(run_logging._PACKAGES, "wandb", ("a_package_that_is_not_installed_xyz", "wandb"))
    with pytest.raises(ImportError, match=r"pip install 'comlrl-gym\[wandb\]'"):
        _magrpo(tmp_path, report_to=["wandb"])
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_report_to_option_values():
    assert MAGRPOConfig().with_overrides(["report_to=wandb"]).report_to == ["wandb"]
    assert MAGRPOConfig().with_overrides(["report_to=[tensorboard, wandb]"]).report_to == ["tensorboard", "wandb"]
    assert run_logging.report_to_backends("tensorboard,wandb") == ["jsonl", "tensorboard", "wandb"]
    assert run_logging.report_to_backends("none") == ["jsonl"]
    with pytest.raises(ConfigError, match="option 'report_to' names 'mlflow'"):
        MAGRPOConfig(report_to=["mlflow"])
