"""One shape for every learner package's TRAINERS table, resolved the same way everywhere."""

from __future__ import annotations

import importlib

import pytest

from comlrl_core.config.options import BaseConfig
from learners import cli
from learners.catalog import ALGORITHMS, learner_classes
from learners.marlhf.marlhf_config import RL_ALGORITHMS
from learners.marlhf.marlhf_trainer import backend_classes

PACKAGES = sorted({package for package, _ in ALGORITHMS.values()})


@pytest.mark.parametrize("package", PACKAGES)
def test_every_table_maps_names_to_config_and_trainer_pairs(package):
    table = importlib.import_module(package).TRAINERS
    assert set(table) == {name for name, (p, _) in ALGORITHMS.items() if p == package}
    for name, entry in table.items():
        assert isinstance(entry, tuple) and len(entry) == 2, name
        config_cls, trainer_cls = entry
        assert issubclass(config_cls, BaseConfig), name
        assert callable(getattr(trainer_cls, "train", None)), name
        # the trainer accepts exactly that config class (or its own subclass of it)
        assert issubclass(config_cls, getattr(trainer_cls, "config_class", config_cls)), name


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_learner_classes_returns_the_packages_pair(algorithm):
    package = importlib.import_module(ALGORITHMS[algorithm][0])
    assert learner_classes(algorithm) == package.TRAINERS[algorithm]
    assert cli.learner_classes is learner_classes  # the command line has no table of its own


def test_magrpo_family_names_its_trainers_and_shares_the_config():
    from learners.magrpo import MAGRPOConfig, MAGRPOTrainer, MAREINFORCETrainer, MAReMaxTrainer, MARLOOTrainer

    assert [learner_classes(a) for a in ("magrpo", "mareinforce", "marloo", "maremax")] == [
        (MAGRPOConfig, MAGRPOTrainer),
        (MAGRPOConfig, MAREINFORCETrainer),
        (MAGRPOConfig, MARLOOTrainer),
        (MAGRPOConfig, MAReMaxTrainer),
    ]


def test_unknown_names_are_rejected_with_the_choices():
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'; choose from magrpo, "):
        learner_classes("ppo")
    with pytest.raises(ValueError, match="rl_algorithm 'madpo' is not an RL backend"):
        backend_classes("madpo")
    assert all(backend_classes(a) == learner_classes(a) for a in RL_ALGORITHMS)
