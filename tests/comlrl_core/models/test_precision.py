"""bf16 mixed precision warns where it is a slowdown: on devices without bf16 hardware.

The CPU kind is simulated by replacing the /proc/cpuinfo reader (and the machine name), so
both branches run on any host.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from comlrl_core.models import precision
from comlrl_core.models.agent_spec import AgentSpec

EPYC = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n"
    "flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512bw\n"
)
SAPPHIRE_RAPIDS = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\n"
    "flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
)
COOPER_LAKE = "model name\t: Intel(R) Xeon(R) Gold 6348H\nflags\t\t: avx2 avx512f avx512_bf16\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
GRAVITON2 = "processor\t: 0\nFeatures\t: fp asimd atomics\n"


@pytest.fixture
def cpu(monkeypatch):
    """Pretend to run on Linux on a CPU with the given /proc/cpuinfo; nothing warned yet."""

    def simulate(cpuinfo: str, machine: str = "x86_64") -> None:
        monkeypatch.setattr(precision.sys, "platform", "linux")
        monkeypatch.setattr(precision, "_read_cpuinfo", lambda: cpuinfo)
        monkeypatch.setattr(precision, "_machine", lambda: machine)
        monkeypatch.setattr(precision, "_warned", set())

    return simulate


def _spec_warnings(**fields) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        AgentSpec("tiny-random", device="cpu", **fields)
    return [w for w in caught if "mixed_precision='bf16'" in str(w.message)]


def test_bf16_on_a_cpu_without_bf16_hardware_warns_once_with_the_reason(cpu, caplog):
    cpu(EPYC)
    assert precision.cpu_bf16_hardware() is False
    with caplog.at_level(logging.WARNING, logger="comlrl_core.models.precision"):
        caught = _spec_warnings(mixed_precision="bf16")
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "SLOWER than fp32" in message and "AMD EPYC 7B13" in message
    assert "avx512_bf16" in message and "amx_bf16" in message and "more than 3x slower" in message
    assert caught[0].filename == __file__  # names the line that built the spec
    logged = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in logged] == [message]
    # once per process: a second bf16 agent says nothing more
    assert _spec_warnings(mixed_precision="bf16") == []


@pytest.mark.parametrize("cpuinfo", [SAPPHIRE_RAPIDS, COOPER_LAKE], ids=["amx_bf16", "avx512_bf16"])
def test_bf16_on_a_cpu_with_bf16_hardware_is_silent(cpu, caplog, cpuinfo):
    cpu(cpuinfo)
    assert precision.cpu_bf16_hardware() is True
    with caplog.at_level(logging.WARNING, logger="comlrl_core.models.precision"):
        assert _spec_warnings(mixed_precision="bf16") == []
    assert not caplog.records


def test_fp32_never_warns(cpu):
    cpu(EPYC)
    assert _spec_warnings(mixed_precision="no") == []
    assert precision._warned == set()  # the bf16 warning is still to come for a bf16 agent


def test_arm_reads_the_bf16_feature(cpu):
    cpu(GRAVITON3, machine="aarch64")
    assert precision.cpu_bf16_hardware() is True
    cpu(GRAVITON2, machine="aarch64")
    assert precision.cpu_bf16_hardware() is False
    assert "no bf16 among the /proc/cpuinfo features" in str(_spec_warnings(mixed_precision="bf16")[0].message)


def test_unknown_cpus_do_not_warn(cpu, monkeypatch):
    cpu("")  # no /proc/cpuinfo
    assert precision.cpu_bf16_hardware() is None
    assert _spec_warnings(mixed_precision="bf16") == []
    cpu(EPYC)
    monkeypatch.setattr(precision.sys, "platform", "darwin")
    assert precision.cpu_bf16_hardware() is None


@pytest.mark.parametrize("supported", [True, False])
def test_cuda_asks_torch(monkeypatch, supported):
    monkeypatch.setattr(precision, "_warned", set())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: supported)
    assert precision.device_bf16_hardware("cuda:0") is supported
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warned = precision.warn_if_bf16_is_slow("cuda:0")
    assert warned is (not supported)
    assert len(caught) == (0 if supported else 1)
    if caught:
        assert "torch.cuda.is_bf16_supported() is False" in str(caught[0].message)
