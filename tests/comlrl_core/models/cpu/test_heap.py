"""comlrl_core.models.cpu.heap: freed large tensors stay in the heap for reuse (checked with glibc's
own counters, in fresh processes since the setting is process-wide)."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest
import torch

from learners.common.setup import tune_host_memory

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc allocator only")

PROBE = textwrap.dedent("""
    import ctypes, sys, torch
    from comlrl_core.models.cpu.heap import retain_freed_memory

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    applied = retain_freed_memory() if sys.argv[1] == "on" else False
    x = torch.ones(64 << 20)  # 256 MiB
    mapped_while_alive = libc.mallinfo2().hblkhd
    del x
    print(applied, mapped_while_alive >> 20, libc.mallinfo2().fordblks >> 20)
""")


def _probe(mode: str) -> tuple[bool, int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    applied, mapped, free_in_heap = out.stdout.split()
    return applied == "True", int(mapped), int(free_in_heap)


def test_freed_tensors_stay_in_the_heap_when_retained():
    applied, mapped, free_in_heap = _probe("on")
    assert applied
    assert mapped < 64  # the 256 MiB tensor came from the heap, not from its own mapping
    assert free_in_heap >= 250  # and its memory is still there for the next step


def test_default_allocator_returns_large_blocks():
    applied, mapped, free_in_heap = _probe("off")
    assert not applied
    assert mapped >= 256 and free_in_heap < 64


TRAIN = textwrap.dedent("""
    import ctypes, tempfile
    import comlrl_core, envs, learners  # noqa: F401 - importing must change nothing
    import torch
    from comlrl_core.models.agent_spec import AgentSpec
    from comlrl_core.models.team import Team
    from learners.magrpo import MAGRPOConfig, MAGRPOTrainer

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    team = Team.from_specs([AgentSpec("tiny-random", device="cpu") for _ in range(2)])
    # first with the defaults, then opted in: the setting is process-wide and one-way
    for options in ({}, {"retain_freed_memory": True}):
        config = MAGRPOConfig(
            num_generations=2, num_turns=1, max_new_tokens=4, max_steps=1, eval_interval=0, progress_bar=False,
            save_final_checkpoint=False, output_dir=tempfile.mkdtemp(), **options)
        MAGRPOTrainer(config, team, "comlrl/Writing-v0").train()
        x = torch.ones(64 << 20)  # 256 MiB
        print(config.retain_freed_memory, libc.mallinfo2().hblkhd >> 20)
        del x
""")


def test_a_cpu_training_run_changes_the_allocator_only_when_asked():
    out = subprocess.run([sys.executable, "-c", TRAIN], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (default_retains, default_mapped), (opted_retains, opted_mapped) = (
        line.split() for line in out.stdout.splitlines()[-2:]
    )
    # imported, built and trained with the defaults: glibc still maps large blocks on their own
    assert default_retains == "False" and int(default_mapped) >= 256
    # opted in: the same tensor now comes from the heap
    assert opted_retains == "True" and int(opted_mapped) < 64


def test_the_option_switches_it_off():
    class Config:
        retain_freed_memory = False

    assert tune_host_memory(Config(), []) is False


def test_only_cpu_teams_change_the_allocator():
    class Config:
        retain_freed_memory = True

    class OnDevice:
        def __init__(self, device):
            self.device = device

    # a device given as a string, as Policy.device allows
    assert tune_host_memory(Config(), [OnDevice("cuda:0"), OnDevice(torch.device("cuda", 1))]) is False
