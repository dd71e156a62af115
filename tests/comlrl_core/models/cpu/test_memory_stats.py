"""comlrl_core.models.cpu.memory_stats: the resident size, the allocator's freed-but-mapped
memory, and handing that memory back, checked in fresh processes on each allocator."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest
import torch

from comlrl_core.models.cpu.allocator import find_library, preload_env
from comlrl_core.models.cpu.memory_stats import host_memory_metrics, peak_resident_bytes, resident_bytes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and Linux allocators")

# A 256 MiB tensor touched and freed: how much the allocator keeps free, and the resident
# size, before and after release_free_memory(). On glibc the heap is told to keep freed
# blocks first (otherwise a block this large is unmapped at once and nothing is kept).
PROBE = textwrap.dedent("""
    import torch
    from comlrl_core.models.cpu.heap import retain_freed_memory
    from comlrl_core.models.cpu.memory_stats import allocator_free_bytes, release_free_memory, resident_bytes
    from comlrl_core.models.cpu.allocator import loaded_allocator

    if loaded_allocator() == "glibc":
        retain_freed_memory()
    x = torch.ones(64 << 20)
    del x
    free_before, rss_before = allocator_free_bytes(), resident_bytes()
    released = release_free_memory()
    free_after, rss_after = allocator_free_bytes(), resident_bytes()
    print(loaded_allocator(), released, free_before >> 20, rss_before >> 20, free_after >> 20, rss_after >> 20)
""")


def _probe(env: dict[str, str]) -> tuple[str, bool, int, int, int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env)
    name, released, *mib = out.stdout.split()
    return name, released == "True", *map(int, mib)  # type: ignore[return-value]


def test_the_resident_size_follows_a_touched_tensor():
    before = resident_bytes()
    x = torch.ones(32 << 20)  # 128 MiB, every page written
    during = resident_bytes()
    assert during - before >= 100 << 20
    assert peak_resident_bytes() >= during
    del x


def test_the_step_metrics_are_gib_and_the_peak_bounds_the_current_size():
    metrics = host_memory_metrics()
    assert 0 < metrics["memory/rss_gib"] <= metrics["memory/peak_rss_gib"]
    assert metrics["memory/rss_gib"] == pytest.approx(resident_bytes() / (1 << 30), rel=0.2)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc allocator only")
def test_glibc_counts_the_kept_block_and_trimming_hands_its_pages_back():
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    name, released, free_before, rss_before, _, rss_after = _probe(env)
    assert name == "glibc" and released
    assert free_before >= 250  # the 256 MiB block, kept in the heap
    assert rss_before - rss_after >= 200  # trimmed: its pages left the process


@pytest.mark.skipif(find_library("tcmalloc") is None, reason="libtcmalloc-minimal4 not installed")
def test_tcmalloc_counts_its_free_pages_and_releases_them():
    name, released, free_before, rss_before, free_after, rss_after = _probe(preload_env("tcmalloc"))
    assert name == "tcmalloc" and released
    assert free_before >= 200
    assert free_after <= 32
    assert rss_before - rss_after >= 200


def test_each_level_releases_at_its_own_boundaries(monkeypatch):
    from comlrl_core.models.cpu import memory_stats

    released: list[int] = []
    monkeypatch.setattr(memory_stats, "release_free_memory", lambda: released.append(1) or True)
    assert memory_stats.end_of_phase() is False and memory_stats.end_of_micro_batch() is False
    with memory_stats.released_between_phases("never"):
        assert memory_stats.end_of_phase() is False
    with memory_stats.released_between_phases("phase") as level:
        assert level == "phase"
        assert memory_stats.end_of_phase() is True and memory_stats.end_of_micro_batch() is False
        with memory_stats.released_between_phases("micro_batch"):  # the innermost level holds
            assert memory_stats.end_of_micro_batch() is True
        assert memory_stats.end_of_micro_batch() is False
    assert memory_stats.end_of_phase() is False
    assert len(released) == 2
    with pytest.raises(ValueError, match="never"):
        with memory_stats.released_between_phases("always"):
            pass
