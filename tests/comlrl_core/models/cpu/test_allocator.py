"""comlrl_core.models.cpu.allocator: which allocator a process runs on, and starting one on another."""

from __future__ import annotations

import subprocess
import sys

import pytest

from comlrl_core.models.cpu import allocator
from comlrl_core.models.cpu.allocator import find_library, loaded_allocator, preload_env

_REPORT = "from comlrl_core.models.cpu.allocator import loaded_allocator; print(loaded_allocator())"

MAPS_GLIBC = """\
7f0000000000-7f0000001000 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000002000-7f0000003000 r-xp 00000000 08:01 2 /usr/bin/python3.11
7f0000004000-7f0000005000 rw-p 00000000 00:00 0 [heap]
"""


def _child_allocator(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", _REPORT], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_the_maps_of_a_process_name_its_allocator():
    assert loaded_allocator(MAPS_GLIBC) == "glibc"
    tcmalloc = MAPS_GLIBC + "7f0000006000-7f0000007000 r-xp 0 08:01 3 /usr/lib/libtcmalloc_minimal.so.4.5.10\n"
    jemalloc = MAPS_GLIBC + "7f0000006000-7f0000007000 r-xp 0 08:01 3 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
    assert loaded_allocator(tcmalloc) == "tcmalloc"
    assert loaded_allocator(jemalloc) == "jemalloc"


def test_a_child_started_on_glibc_runs_on_glibc_even_under_a_preload():
    env = preload_env("glibc", {"PATH": "/usr/bin", "LD_PRELOAD": "/usr/lib/libjemalloc.so.2:/opt/libother.so"})
    assert env["LD_PRELOAD"] == "/opt/libother.so"  # only the allocator is removed
    assert "LD_PRELOAD" not in preload_env("glibc", {"LD_PRELOAD": "libtcmalloc_minimal.so.4"})
    assert _child_allocator(preload_env("glibc")) == "glibc"


@pytest.mark.parametrize("name", ["tcmalloc", "jemalloc"])
def test_a_child_started_on_an_allocator_runs_on_it(name):
    if find_library(name) is None:
        pytest.skip(f"no {name} on this machine")
    env = preload_env(name, preload_env("glibc"))
    assert env["LD_PRELOAD"] == find_library(name)
    assert _child_allocator(env) == name


def test_the_command_line_prints_the_library_to_preload(monkeypatch, capsys):
    monkeypatch.setattr(allocator.ctypes.util, "find_library", lambda name: f"lib{name}.so.9")
    assert allocator.main(["--library", "tcmalloc"]) == 0
    assert capsys.readouterr().out.strip() == "libtcmalloc_minimal.so.9"
    env = preload_env("tcmalloc", {"LD_PRELOAD": "/opt/libother.so"})
    assert env["LD_PRELOAD"] == "libtcmalloc_minimal.so.9:/opt/libother.so"
    assert env["TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"] == str(1 << 40)


def test_a_missing_library_names_the_package_to_install(monkeypatch, capsys):
    monkeypatch.setattr(allocator.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(FileNotFoundError, match="apt-get install libtcmalloc-minimal4"):
        preload_env("tcmalloc")
    assert allocator.main(["--library", "jemalloc"]) == 1
    assert "apt-get install libjemalloc2" in capsys.readouterr().err


def test_an_unknown_allocator_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"unknown allocator 'mimalloc': choose one of \['jemalloc', 'tcmalloc'\]"):
        find_library("mimalloc")


def test_the_shell_exports_start_a_process_on_the_allocator(monkeypatch, capsys):
    # scripts/main.sh evaluates these lines: they must carry exactly preload_env's changes
    monkeypatch.setattr(allocator.ctypes.util, "find_library", lambda name: f"lib{name}.so.9")
    monkeypatch.setenv("LD_PRELOAD", "/opt/lib other.so")
    monkeypatch.delenv("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", raising=False)
    assert allocator.main(["--exports", "tcmalloc"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "export LD_PRELOAD=libtcmalloc_minimal.so.9:/opt/lib:other.so",  # LD_PRELOAD splits at spaces too
        f"export TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD={1 << 40}",
    ]


def test_a_child_of_the_shell_exports_runs_on_tcmalloc():
    if find_library("tcmalloc") is None:
        pytest.skip("no tcmalloc on this machine")
    script = 'eval "$(' + f"{sys.executable} -m comlrl_core.models.cpu.allocator --exports tcmalloc" + ')"; '
    script += f"exec {sys.executable} -c '{_REPORT}'"
    done = subprocess.run(["bash", "-c", script], env=preload_env("glibc"), capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "tcmalloc"
