"""Learners that are not data-parallel refuse a multi-process launcher (``WORLD_SIZE > 1``)."""

from __future__ import annotations

import pytest

from comlrl_core.cli import main as cli_main
from learners.catalog import ALGORITHMS, learner_classes
from learners.common.components import DatasetEnvFactory, build_team
from learners.common.distributed import DATA_PARALLEL_LEARNERS, refuse_launcher

ROWS = [{"prompt": f"Say hello {i}."} for i in range(3)]


def _reward(completions1, completions2, batch_items=None):
    return [0.0 for _ in completions1]


def test_the_data_parallel_table_matches_the_trainers():
    for algorithm in ALGORITHMS:
        trainer_cls = learner_classes(algorithm)[1]
        assert trainer_cls.data_parallel == (algorithm in DATA_PARALLEL_LEARNERS), algorithm


@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a not in DATA_PARALLEL_LEARNERS])
def test_a_learner_that_is_not_data_parallel_refuses_world_size_2(tmp_path, monkeypatch, algorithm):
    config_cls, trainer_cls = learner_classes(algorithm)
    config = config_cls(output_dir=str(tmp_path / "run"), num_agents=2)
    factory = DatasetEnvFactory({"dataset": ROWS, "reward_func": _reward})
    team = build_team(config, factory)  # built as one process
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="not data-parallel") as err:
        trainer_cls(config, team, factory)
    for name in DATA_PARALLEL_LEARNERS:
        assert name in str(err.value)
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_data_parallel_learners_pass_the_guard(tmp_path, monkeypatch):
    from learners.actor_critic import IACConfig, IACTrainer
    from learners.magrpo import MAGRPOConfig, MAGRPOTrainer

    magrpo = MAGRPOTrainer.from_components(
        agent_model="tiny-random", train_dataset=ROWS, reward_func=_reward, args=MAGRPOConfig(output_dir=str(tmp_path))
    )
    iac = IACTrainer.from_components(
        agent_model="tiny-random", train_dataset=ROWS, reward_func=_reward, args=IACConfig(output_dir=str(tmp_path))
    )
    monkeypatch.setenv("WORLD_SIZE", "4")
    magrpo._check_run_setup()  # data-parallel: a launcher is welcome
    with pytest.raises(RuntimeError, match="WORLD_SIZE=4"):
        iac._check_run_setup()
    monkeypatch.setenv("WORLD_SIZE", "1")
    iac._check_run_setup()
    refuse_launcher("anything")


def test_the_cli_refuses_before_loading_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    rc = cli_main(["train", "maac", "--env", "comlrl/Writing-v0", f"output_dir={tmp_path / 'run'}"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "maac is not data-parallel" in err and ", ".join(DATA_PARALLEL_LEARNERS) in err
    assert not (tmp_path / "run").exists()
