"""Harness semantics and the process backend (runs anywhere, no Docker)."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox import Program, Sandbox, Status
from sandbox.process_backend import network_isolation

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

ADD = "def add(a, b):\n    return a + b\n"


def test_pass_fail_error_and_output(process_box):
    passed, failed, errored, printed = process_box.run(
        [
            Program(ADD, tests="assert add(1, 2) == 3"),
            Program(ADD, tests="assert add(1, 2) == 4, 'wrong sum'"),
            Program(ADD, tests="add(1, None)"),
            Program("import sys\nprint('out')\nprint('err', file=sys.stderr)"),
        ]
    )
    assert passed.status == Status.PASSED and passed.passed and passed.asserts is None
    assert (failed.status, failed.error_type, failed.error_message) == (Status.FAILED, "AssertionError", "wrong sum")
    assert errored.status == Status.ERROR and errored.error_type == "TypeError"
    assert "unsupported operand" in errored.error_message
    assert printed.status == Status.PASSED
    assert (printed.stdout, printed.stderr) == ("out\n", "err\n")
    assert not printed.stdout_truncated and printed.backend == "process"
    assert all(r.duration > 0 for r in (passed, failed, errored, printed))


def test_per_assert_list_reports_each_statement(process_box):
    result = process_box.run_one(
        ADD,
        [
            "assert add(1, 1) == 2",
            "assert add(2, 2) == 5",
            "assert add('a', 1) == 'a1'",
            "assert add(0, 0) == 0",
            "assert ((",
        ],
        per_assert=True,
    )
    assert result.status == Status.FAILED  # the first failing statement decides
    assert [a.passed for a in result.asserts] == [True, False, False, True, False]
    assert [a.index for a in result.asserts] == [0, 1, 2, 3, 4]
    assert result.asserts[1].text == "assert add(2, 2) == 5"
    assert result.asserts[1].error_type == "AssertionError"
    assert result.asserts[2].error_type == "TypeError"
    assert result.asserts[4].error_type == "SyntaxError"
    assert result.pass_rate == pytest.approx(2 / 5)


def test_per_assert_block_is_split_into_top_level_statements(process_box):
    tests = (
        "import math\n"
        "def near(x, y):\n    return math.isclose(x, y)\n"
        "assert near(add(0.1, 0.2), 0.3)\n"
        "assert add(1,\n           1) == 3\n"
        "for i in range(3):\n    assert add(i, 0) == i\n"
    )
    result = process_box.run_one(ADD, tests, per_assert=True)
    # import/def are setup, not reported; the multi-line assert keeps its full text
    assert [(a.passed, a.text) for a in result.asserts] == [
        (True, "assert near(add(0.1, 0.2), 0.3)"),
        (False, "assert add(1,\n           1) == 3"),
        (True, "for i in range(3):\n    assert add(i, 0) == i"),
    ]
    assert result.status == Status.FAILED


def test_program_errors_give_error_status_and_no_asserts(process_box):
    syntax, raising, bad_tests = process_box.run(
        [
            Program("def f(:\n    pass", tests=["assert f()"], per_assert=True),
            Program("raise ValueError('at import')", tests=["assert True"], per_assert=True),
            Program(ADD, tests="assert add(1, 2) ==", per_assert=True),
        ]
    )
    assert syntax.status == Status.ERROR and syntax.asserts is None
    assert syntax.error_type == "SyntaxError"
    assert "line 1, column 7" in syntax.error_message
    assert syntax.extra["phase"] == "program"
    assert (raising.status, raising.error_type, raising.error_message) == (Status.ERROR, "ValueError", "at import")
    assert raising.asserts is None and "<program>" in raising.extra["traceback"]
    assert bad_tests.status == Status.ERROR and bad_tests.error_type == "SyntaxError"
    assert bad_tests.error_message.startswith("in tests:")


def test_timeout_kills_the_process_group(process_box, tmp_path):
    # The program forks a sleeper in its own process group; both must die.
    source = (
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n    time.sleep(60)\n    os._exit(0)\n"
        "print(pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    result = process_box.run_one(Program(source, timeout=0.5))
    assert result.status == Status.TIMEOUT and result.error_type == "Timeout"
    sleeper = int(result.stdout.split()[0])
    for _ in range(100):  # dead (a zombie waiting for its reaper counts as dead)
        try:
            with open(f"/proc/{sleeper}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    break
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"forked sleeper {sleeper} survived the timeout")


def test_memory_bomb_is_memory(process_box):
    bomb, growing = process_box.run(
        [
            Program("x = bytearray(4 * 2**30)"),
            Program("chunks = []\nwhile True:\n    chunks.append(bytearray(2**24))"),
        ]
    )
    assert bomb.status == Status.MEMORY and bomb.error_type == "MemoryError"
    assert growing.status == Status.MEMORY


def test_output_is_capped_and_marked_truncated():
    with Sandbox(backend="process", pool_size=1, output_cap=4096) as box:
        result = box.run_one("import sys\nsys.stdout.write('x' * 10**7)\nsys.stderr.write('e' * 100)")
    assert result.status == Status.PASSED
    assert result.stdout == "x" * 4096 and result.stdout_truncated
    assert result.stderr == "e" * 100 and not result.stderr_truncated


@pytest.mark.parametrize(
    "source, error_type",
    [
        ("import sys\nsys.exit(0)", "SystemExit"),
        ("raise SystemExit(0)", "SystemExit"),
        ("import os\nos._exit(0)", "EarlyExit"),
    ],
)
def test_exiting_early_never_passes(process_box, source, error_type):
    result = process_box.run_one(source, ["assert False"], per_assert=True)
    assert result.status == Status.KILLED and result.error_type == error_type
    assert result.asserts is None


def test_exit_during_tests_is_killed(process_box):
    result = process_box.run_one(
        ADD, ["assert add(1, 1) == 2", "import os; os._exit(0)", "assert False"], per_assert=True
    )
    assert result.status == Status.KILLED


@pytest.mark.parametrize(
    "source",
    [
        "AssertionError = type('AssertionError', (BaseException,), {})",
        "import builtins\nbuiltins.AssertionError = KeyError\nbuiltins.isinstance = lambda *a: False",
        "import builtins\nbuiltins.repr = lambda x: 'passed'\nbuiltins.len = lambda x: 0",
        "import os\nos.write = lambda *a: 0\nos._exit = lambda *a: None",
        'import json\njson.dumps = lambda *a, **k: \'{"status": "passed"}\'',
        "print(\"('x', 1, 'passed', None, None, 'tests', '', None)\")",
    ],
)
def test_faked_passes_fail(process_box, source):
    result = process_box.run_one(source, "assert 1 == 2")
    assert result.status == Status.FAILED and result.error_type == "AssertionError"


def test_writing_the_verdict_channel_is_tampering(process_box):
    source = "import os\nos.write(3, b\"('guess', 1, 'passed', None, None, 'tests', '', None)\\n\")"
    result = process_box.run_one(source, "assert 1 == 2")
    assert result.status == Status.KILLED and result.error_type == "Tampered"


def test_fresh_dir_and_process_per_program(process_box):
    first, second = process_box.run(
        [
            Program("import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd(), os.getpid())"),
            Program("import os\nprint(os.getcwd(), os.getpid(), os.path.exists('left.txt'))"),
        ]
        * 1
    )
    dir1, pid1 = first.stdout.split()
    dir2, pid2, exists = second.stdout.split()
    assert dir1 != dir2 and pid1 != pid2 and exists == "False"
    assert not os.path.exists(dir1)  # removed after the run


def test_host_environment_does_not_leak(monkeypatch):
    monkeypatch.setenv("COMLRL_TEST_SECRET", "hunter2")
    with Sandbox(backend="process", pool_size=1) as box:
        result = box.run_one("import os\nprint(sorted(os.environ))")
    assert "COMLRL_TEST_SECRET" not in result.stdout and "HOME" in result.stdout


@pytest.mark.skipif(network_isolation()[1] == "none", reason="unshare -n not permitted here")
def test_network_is_unreachable(process_box):
    result = process_box.run_one("import socket\nsocket.create_connection(('10.255.255.1', 80), timeout=2)")
    assert result.status == Status.ERROR and result.error_type == "OSError"


def test_batch_keeps_order_beyond_pool_size(process_box):
    results = process_box.run([Program(f"print({i})") for i in range(9)])
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(9)]
    workers = {r.extra["worker"] for r in results}
    assert 1 <= len(workers) <= 2  # concurrency bounded by the pool


def test_bad_input_is_rejected_before_running(process_box):
    with pytest.raises(TypeError, match="Program or a source string"):
        process_box.run([123])
    with pytest.raises(TypeError, match="tests"):
        process_box.run([Program("pass", tests=[1, 2])])
    with pytest.raises(ValueError, match="timeout"):
        process_box.run([Program("pass", timeout=-1)])
    assert process_box.run([]) == []


def test_closed_sandbox_refuses_to_run():
    box = Sandbox(backend="process", pool_size=1)
    assert box.run_one("pass").passed
    box.close()
    box.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        box.run_one("pass")


garbage = st.one_of(
    st.text(max_size=200), st.sampled_from(["\ud800", "x = '\udfff'", "\x00", "(" * 500, "def f(:", ""])
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(source=garbage, tests=st.one_of(st.none(), st.lists(st.text(max_size=40), max_size=3)))
def test_garbage_never_raises(process_box, source, tests):
    result = process_box.run_one(source, tests, per_assert=True)
    assert isinstance(result.status, Status)
    if result.asserts is not None:  # complete unless an exit or MemoryError stopped the tests
        complete = result.status in (Status.PASSED, Status.FAILED, Status.ERROR)
        if complete:
            assert len(result.asserts) == len(tests or [])
        else:
            assert len(result.asserts) <= len(tests or [])
    if result.status == Status.PASSED and tests:
        assert all(a.passed for a in result.asserts)
