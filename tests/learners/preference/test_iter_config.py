"""Iterative preference options read the way CoMLRL documents them."""

from __future__ import annotations

import pathlib

import pytest

from comlrl_core.config import ConfigError
from learners.madpo.madpo_iter import MADPOIterConfig
from learners.marlhf.marlhf_iter import MARLHFIterConfig


@pytest.mark.parametrize("config_class", [MADPOIterConfig, MARLHFIterConfig])
def test_comparator_devices_accepts_one_device_as_a_string(config_class, tmp_path: pathlib.Path) -> None:
    from_yaml_dict = config_class.from_dict({"comparator_devices": "cuda:1"})
    from_python = config_class(comparator_devices="cuda:1")
    from_override = config_class().with_overrides(["comparator_devices=cuda:1"])
    for cfg in (from_yaml_dict, from_python, from_override):
        assert cfg.comparator_devices == ["cuda:1"]
    reloaded = config_class.from_yaml(from_python.to_yaml(tmp_path / "cfg.yaml"))
    assert reloaded.comparator_devices == ["cuda:1"]


def test_comparator_devices_keeps_a_per_agent_list() -> None:
    cfg = MADPOIterConfig().with_overrides(["comparator_devices=[cpu, cuda:1]"])
    assert cfg.comparator_devices == ["cpu", "cuda:1"]


def test_comparator_devices_rejects_other_types() -> None:
    with pytest.raises(ConfigError, match="comparator_devices"):
        MADPOIterConfig.from_dict({"comparator_devices": 3})
