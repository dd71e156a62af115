"""Pieces of the sandbox that need neither Docker nor a running server."""

from __future__ import annotations

import argparse
import os
import socket
import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sandbox.sandbox as sandbox_module
from sandbox import Program, Sandbox, SandboxConfig, SandboxUnavailable
from sandbox._child import token_line
from sandbox._server import _parse_verdict
from sandbox.cli import add_commands
from sandbox.docker_backend import LABEL, container_options, owner_alive, owner_labels
from sandbox.image import image_tag
from sandbox.protocol import FrameDecoder, as_program, encode_frame, server_source


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("backend", "vm", "backend='vm'"),
        ("pool_size", 0, "pool_size=0"),
        ("timeout", 0, "timeout=0"),
        ("memory_mb", 8, "memory_mb=8"),
        ("pids", 1, "pids=1"),
        ("output_cap", 10, "output_cap=10"),
    ],
)
def test_config_rejects_bad_options_by_name(option, value, message):
    with pytest.raises(ValueError, match=message):
        SandboxConfig(**{option: value})


def test_config_defaults():
    config = SandboxConfig()
    assert config.pool_size == (os.cpu_count() or 1) + 2
    assert (config.timeout, config.memory_mb, config.pids, config.cpus, config.tmpfs_mb) == (10.0, 512, 64, 1.0, 64)
    assert config.server_config()["memory_bytes"] == 512 << 20


def test_as_program_accepts_source_and_rejects_junk():
    assert as_program("x = 1") == Program("x = 1")
    with pytest.raises(TypeError):
        as_program(b"x = 1")
    with pytest.raises(TypeError):
        as_program(Program(source=None))  # type: ignore[arg-type]


@given(
    st.lists(
        st.dictionaries(st.text(max_size=5), st.one_of(st.text(), st.integers(), st.none()), max_size=4), max_size=4
    ),
    st.lists(st.integers(min_value=1, max_value=7), min_size=1),
)
def test_frames_round_trip_whatever_the_chunking(messages, cuts):
    data = b"".join(encode_frame(m) for m in messages)
    decoder, received, position, i = FrameDecoder(), [], 0, 0
    while position < len(data):
        step = cuts[i % len(cuts)]
        decoder.feed(data[position : position + step])
        position, i = position + step, i + 1
        while (message := decoder.next_message()) is not None:
            received.append(message)
    assert received == messages


def test_lone_surrogates_survive_the_frame():
    decoder = FrameDecoder()
    decoder.feed(encode_frame({"source": "x = '\ud800'"}))
    assert decoder.next_message() == {"source": "x = '\ud800'"}


def test_server_source_compiles_and_fits_one_argument():
    source = server_source()
    compile(source, "<server>", "exec")
    assert len(source.encode()) < 128 * 1024  # Linux MAX_ARG_STRLEN for one argv entry


SEED = b"s" * 32
PLAN = repr(("plan", [("assert f(1) == 1", "check"), ("x = 2", "setup"), ("assert f(2) == 2", "check")], 3))


def _lines(*items: bytes | tuple) -> bytes:
    return b"".join((i if isinstance(i, bytes) else repr(i).encode()) + b"\n" for i in items)


def _detail(unit: int, status: str = "failed") -> tuple:
    return ("unit", unit, status, "AssertionError", "", "")


def test_a_unit_passes_only_with_its_token():
    tokens = [token_line(SEED, u) for u in range(4)]
    verdict, tampered = _parse_verdict(PLAN.encode() + b"\n" + b"".join(tokens), SEED, True)
    assert verdict["status"] == "passed" and not tampered
    assert [(a["index"], a["passed"]) for a in verdict["asserts"]] == [(0, True), (2, True)]
    # a failure's detail for unit 3, with the other tokens: failed, the others still pass
    raw = _lines(PLAN.encode(), *tokens[:3], _detail(3))
    verdict, _ = _parse_verdict(raw, SEED, True)
    assert verdict["status"] == "failed" and [a["passed"] for a in verdict["asserts"]] == [True, False]
    # a token from another seed, or for a unit that does not exist, is tampering
    assert _parse_verdict(_lines(PLAN.encode(), token_line(b"x" * 32, 0)), SEED, True) == (None, True)
    assert _parse_verdict(_lines(PLAN.encode(), token_line(SEED, 9)), SEED, True) == (None, True)
    # a detail that claims a pass is not a detail; junk is tampering
    assert _parse_verdict(_lines(PLAN.encode(), *tokens[:3], _detail(3, "passed")), SEED, True) == (None, True)
    assert _parse_verdict(_lines(PLAN.encode(), b"junk"), SEED, True) == (None, True)
    # the plan must come first (it is written before any untrusted code runs)
    assert _parse_verdict(_lines(*tokens, PLAN.encode()), SEED, True) == (None, True)


def test_missing_tokens_without_details_leave_the_verdict_to_the_exit_status():
    tokens = [token_line(SEED, u) for u in range(4)]
    assert _parse_verdict(_lines(PLAN.encode(), *tokens[:2]), SEED, True) == (None, False)
    assert _parse_verdict(b"", SEED, True) == (None, False)
    verdict, _ = _parse_verdict(_lines(PLAN.encode(), _detail(0, "error")), SEED, False)
    assert verdict["status"] == "error" and verdict["extra"]["phase"] == "program"


def test_container_options_lock_the_container_down():
    options = container_options(SandboxConfig(memory_mb=256, tmpfs_mb=32, pids=16, cpus=0.5))
    assert options["user"] == "65534:65534" and options["network_mode"] == "none"
    assert options["read_only"] and options["cap_drop"] == ["ALL"]
    assert options["security_opt"] == ["no-new-privileges"]
    assert options["mem_limit"] == options["memswap_limit"] == "352m"
    assert options["pids_limit"] == 16 and options["nano_cpus"] == 500_000_000
    assert "size=32m" in options["tmpfs"]["/tmp"]
    assert options["labels"][f"{LABEL}.owner_pid"] == str(os.getpid())


def test_owner_alive_tells_dead_and_reused_owners():
    labels = owner_labels()
    assert owner_alive(labels)
    assert not owner_alive({**labels, f"{LABEL}.owner_start": "1"})  # pid reused
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    assert not owner_alive({**labels, f"{LABEL}.owner_pid": str(dead)})
    # another host's containers are never judged from here
    assert owner_alive(
        {**labels, f"{LABEL}.owner_host": socket.gethostname() + "-other", f"{LABEL}.owner_pid": str(dead)}
    )


def test_image_tag_is_a_content_tag():
    from sandbox import image

    assert image_tag() == image_tag()
    assert image_tag() != image_tag({**image.RECIPE, "include": ["python3", "gcc"]})
    assert image_tag().startswith("comlrl-sandbox:bookworm-")


def test_without_an_engine_docker_fails_and_auto_falls_back(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(SandboxUnavailable, match="no Docker engine answers"):
        Sandbox(backend="docker")
    monkeypatch.setattr(sandbox_module, "_fallback_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Sandbox(backend="auto", pool_size=1) as box:
            assert box.backend == "process"
        with Sandbox(backend="auto", pool_size=1) as again:  # warned once only
            assert again.backend == "process"
    fallbacks = [w for w in caught if "isolates less than Docker" in str(w.message)]
    assert len(fallbacks) == 1


def test_cli_adds_sandbox_subcommands():
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    build = parser.parse_args(["sandbox", "build-image", "--force"])
    assert build.force and callable(build.func)
    status = parser.parse_args(["sandbox", "status", "--prune"])
    assert status.prune and callable(status.func) and status.func is not build.func


def test_cli_status_without_an_engine(monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["sandbox", "status"])
    assert args.func(args) == 1
    out = capsys.readouterr().out
    assert "docker engine: not available" in out and image_tag() in out
