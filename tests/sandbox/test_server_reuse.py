"""What the fork server prepares once and reuses across programs: compiled test suites,
the clean environment, the OOM counter descriptor. Reuse must never let one program
change what another one runs against."""

from __future__ import annotations

import pytest

import sandbox._server as server
from sandbox import Program, Sandbox, Status

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SQUARE = "def f(x):\n    return x * x\n"
WRONG = "def f(x):\n    return x + 3\n"


@pytest.fixture(autouse=True)
def _empty_cache(monkeypatch):
    monkeypatch.setattr(server, "_tests_cache", {})


def test_a_suite_is_compiled_once_per_mode():
    first = server._compiled_tests("assert f(2) == 4", False)
    assert first is not None and first[0][2] == "check"
    assert server._compiled_tests("assert f(2) == 4", False) is first
    per_assert = server._compiled_tests("x = 2\nassert f(x) == 4", True)
    assert [kind for _, _, kind, _ in per_assert] == ["setup", "check"]
    listed = server._compiled_tests(["assert f(2) == 4", "assert f(3) == 9"], True)
    assert [text for text, _, _, _ in listed] == ["assert f(2) == 4", "assert f(3) == 9"]
    assert server._compiled_tests(["assert f(2) == 4", "assert f(3) == 9"], True) is listed
    assert len(server._tests_cache) == 3


@pytest.mark.parametrize(
    "tests",
    [
        "assert ((",  # the child reports the syntax error
        ["assert f(2) == 4", "assert (("],  # no exception object goes to a child from the cache
        "assert f(0) == 0\n" * 10_000,  # too large to keep
        None,
        [1, 2],
    ],
)
def test_suites_not_cached_are_compiled_by_the_child(tests):
    assert server._compiled_tests(tests, True) is None
    assert server._tests_cache == {}


def test_the_least_recently_used_suite_is_evicted(monkeypatch):
    monkeypatch.setattr(server, "_TESTS_CACHE_ENTRIES", 2)
    a = server._compiled_tests("assert 1", False)
    server._compiled_tests("assert 2", False)
    assert server._compiled_tests("assert 1", False) is a  # now the most recently used
    server._compiled_tests("assert 3", False)
    assert [key[1] for key in server._tests_cache] == ["assert 1", "assert 3"]


def test_the_cache_is_bounded_by_text_size(monkeypatch):
    monkeypatch.setattr(server, "_TESTS_CACHE_CHARS", 30)
    server._compiled_tests("assert 1 == 1  # a fifteen", False)
    server._compiled_tests("assert 2 == 2  # b fifteen", False)
    assert [key[1] for key in server._tests_cache] == ["assert 2 == 2  # b fifteen"]


@pytest.mark.parametrize(
    "content, count",
    [
        (b"low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n", 2),  # cgroup v2 memory.events
        (b"oom_kill_disable 0\nunder_oom 0\noom_kill 7\n", 7),  # cgroup v1 memory.oom_control
        (b"low 0\n", None),
    ],
)
def test_oom_counter_is_reread_from_its_open_descriptor(tmp_path, content, count):
    path = tmp_path / "memory.events"
    path.write_bytes(content)
    with open(path, "rb") as f:
        assert server._oom_kills(f.fileno()) == count
        if count is not None:
            path.write_bytes(content.replace(b"oom_kill %d" % count, b"oom_kill %d" % (count + 1)))
            assert server._oom_kills(f.fileno()) == count + 1  # the same descriptor sees the change
    assert server._oom_kills(None) is None


@pytest.fixture(scope="module")
def one_server():
    """One worker: every program forks from the same server, so they share its cache."""
    with Sandbox(backend="process", pool_size=1, timeout=5.0) as box:
        yield box


@pytest.mark.parametrize("per_assert", [False, True])
def test_programs_sharing_a_suite_get_their_own_verdicts(one_server, per_assert):
    tests = "x = 2\nassert f(x) == 4\nassert f(3) == 9"
    results = one_server.run([Program(src, tests=tests, per_assert=per_assert) for src in (SQUARE, WRONG, SQUARE)])
    assert [r.status for r in results] == [Status.PASSED, Status.FAILED, Status.PASSED]
    # the failing test's line comes from the child's own linecache entry, not the compile
    assert "assert f(x) == 4" in results[1].extra["traceback"]
    if per_assert:
        assert [a.passed for a in results[1].asserts] == [False, False]


def test_a_broken_suite_is_reported_every_time(one_server):
    results = one_server.run([Program(SQUARE, tests="assert ((")] * 2)
    assert [(r.status, r.error_type) for r in results] == [(Status.ERROR, "SyntaxError")] * 2
    assert all(r.error_message.startswith("in tests:") for r in results)


POISON = """
import sys
def f(x):
    return x + 3
poisoned = 0
frame = sys._getframe()
while frame is not None:
    for value in list(frame.f_locals.values()):
        if isinstance(value, list) and value and all(isinstance(u, tuple) and len(u) == 4 for u in value):
            value[:] = [(text, compile("pass", "<tests>", "exec"), kind, None) for text, _, kind, _ in value]
            poisoned += 1
    frame = frame.f_back
print(poisoned)
"""


def test_a_program_cannot_change_the_suite_the_next_program_runs(one_server):
    tests = ["assert f(2) == 4", "assert f(3) == 9"]
    one_server.run([Program(SQUARE, tests=tests)])  # the suite is in the server's cache now
    poisoner, victim = one_server.run([Program(POISON, tests=tests), Program(WRONG, tests=tests)])
    assert int(poisoner.stdout) >= 1  # it reached its copy of the compiled suite and rewrote it...
    assert poisoner.status == Status.FAILED  # ...too late for its own run (the units were bound)
    assert victim.status == Status.FAILED and victim.error_type == "AssertionError"  # and not the server's


def test_the_child_environment_is_the_clean_base_plus_its_dirs(one_server):
    result = one_server.run_one("import os\nprint(sorted(os.environ.items()))")
    environment = dict(eval(result.stdout))  # noqa: S307 - our own print of a list of str pairs
    assert set(environment) == {"PATH", "LANG", "HOME", "TMPDIR"}
    assert environment["HOME"] == environment["TMPDIR"] != "/"
    again = one_server.run_one("import os\nprint(os.environ['HOME'])")
    assert again.stdout.strip() != environment["HOME"]  # a fresh work dir per program
