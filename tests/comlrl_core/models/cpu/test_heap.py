"""comlrl_core.models.cpu.heap: freed large tensors stay in the heap for reuse while asked, and
go back to the kernel after (checked with glibc's own counters, in fresh processes since the
setting is process-wide)."""

from __future__ import annotations

import contextlib
import platform
import subprocess
import sys
import textwrap

import pytest
import torch

from learners.catalog import ALGORITHMS, learner_classes
from learners.common.setup import tune_host_memory

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc allocator only")

# Shared by the fresh-process scripts: glibc's counters and the resident size.
PRELUDE = textwrap.dedent("""
    import ctypes, os, sys, torch

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
            "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2

    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20

    def mapped_mib():  # a 256 MiB tensor: MiB of glibc's own mappings while it is alive
        x = torch.ones(64 << 20)
        mapped = libc.mallinfo2().hblkhd >> 20
        del x
        return mapped
""")

PROBE = PRELUDE + textwrap.dedent("""
    from comlrl_core.models.cpu.heap import retain_freed_memory

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


SCOPED = PRELUDE + textwrap.dedent("""
    from comlrl_core.models.cpu import heap

    base = rss_mib()

    def use(tag):  # a 256 MiB tensor: its own mapping, or from the heap; then freed
        x = torch.ones(64 << 20)
        mapped = libc.mallinfo2().hblkhd >> 20
        del x
        print(tag, mapped, rss_mib() - base)  # resident memory the freed tensor left behind

    def left(tag):  # resident memory still held once a block is over
        print(tag, -1, rss_mib() - base)

    with heap.retained_heap(enabled=False) as applied:  # first: glibc's untouched defaults
        use(f"disabled-{applied}")
    with heap.retained_heap() as applied:
        with heap.retained_heap():  # nested: the outer block owns the setting
            use("inner")
        use(f"outer-{applied}")
    left("after")
    try:
        with heap.retained_heap():
            use("failing")
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    left("after-error")
    heap.retain_freed_memory()  # the host's own process-wide choice
    with heap.retained_heap():
        use("host-choice")
    left("host-choice-kept")
""")


def test_retained_heap_keeps_memory_inside_and_hands_it_back_after():
    out = subprocess.run([sys.executable, "-c", SCOPED], capture_output=True, text=True, check=True)
    rows = {tag: (int(mapped), int(kept)) for tag, mapped, kept in (line.split() for line in out.stdout.splitlines())}
    # inside (also after a nested block ended): the tensor comes from the heap and its
    # pages stay resident once freed
    for tag in ("inner", "outer-True", "failing", "host-choice"):
        mapped, kept_resident = rows[tag]
        assert mapped < 64 and kept_resident >= 200, tag
    # once the block is over (also when an exception left it), that memory is back with the kernel
    for tag in ("after", "after-error"):
        assert rows[tag][1] < 64, tag
    # disabled: glibc's defaults (its own mapping, unmapped on free)
    mapped, kept_resident = rows["disabled-False"]
    assert mapped >= 256 and kept_resident < 64
    # a process-wide retain_freed_memory() of the host is not undone by a block
    assert rows["host-choice-kept"][1] >= 200


TRAIN = PRELUDE + textwrap.dedent("""
    import tempfile
    import comlrl_core, envs, learners  # noqa: F401 - importing must change nothing
    from comlrl_core.models.agent_spec import AgentSpec
    from comlrl_core.models.team import Team
    from learners.magrpo import MAGRPOConfig, MAGRPOTrainer

    team = Team.from_specs([AgentSpec("tiny-random", device="cpu") for _ in range(2)])
    print("built", mapped_mib(), rss_mib())
    for options in ({"retain_freed_memory": False}, {}):
        config = MAGRPOConfig(
            num_generations=2, num_turns=1, max_new_tokens=4, max_steps=1, eval_interval=0, progress_bar=False,
            save_final_checkpoint=False, output_dir=tempfile.mkdtemp(), **options)
        trainer = MAGRPOTrainer(config, team, "comlrl/Writing-v0")
        seen = []
        step = trainer.train_step
        trainer.train_step = lambda: (seen.append(mapped_mib()), step())[1]
        trainer.train()
        print(config.retain_freed_memory, seen[0], rss_mib())
""")


def test_training_keeps_freed_memory_only_while_it_runs():
    out = subprocess.run([sys.executable, "-c", TRAIN], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    built, off, default = (line.split() for line in out.stdout.splitlines()[-3:])
    # importing and building the team change nothing: glibc maps large blocks on their own
    assert int(built[1]) >= 256
    # retain_freed_memory: false: glibc's behaviour during the run too
    assert off[0] == "False" and int(off[1]) >= 256
    # the default: large tensors come from the heap during train() ...
    assert default[0] == "True" and int(default[1]) < 64
    # ... and once it returned, the 256 MiB it kept are back with the kernel (the tiny
    # team's optimizer state is a few MB)
    assert int(default[2]) - int(built[2]) < 64


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


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_learner_trains_inside_the_retained_heap(algorithm, monkeypatch):
    """Each trainer's ``train`` enters the heap block with its ``retain_heap`` verdict."""
    import learners.common.setup as setup

    _, trainer_cls = learner_classes(algorithm)
    entered: list[bool] = []

    @contextlib.contextmanager
    def spy(enabled: bool = True):
        entered.append(enabled)
        yield enabled

    monkeypatch.setattr(setup, "retained_heap", spy)
    host = trainer_cls.__new__(trainer_cls)  # never built: train stops at its first attribute
    host.retain_heap = True
    with pytest.raises(AttributeError):
        host.train()
    assert entered == [True]
