"""Adversarial programs against the Docker backend: each is contained, classified, and
the pool goes on serving correct results right after it."""

from __future__ import annotations

import time
import uuid

import pytest

from sandbox import Program, Status

pytestmark = pytest.mark.docker

ADD = "def add(a, b):\n    return a + b\n"
CANARIES = [
    Program(ADD, tests="assert add(2, 3) == 5"),
    Program(ADD, tests="assert add(2, 3) == 6"),
    Program(ADD, tests="assert add(1, 1) == 2"),
    Program(ADD, tests="add(1, None)"),
]


def assert_pool_serves(box):
    """Both pool containers answer correctly right after an adversarial program."""
    results = box.run(CANARIES)
    assert [r.status for r in results] == [Status.PASSED, Status.FAILED, Status.PASSED, Status.ERROR]


def run_adversary(box, source, tests="assert True", timeout=2.0):
    result = box.run_one(Program(source, tests=tests, timeout=timeout))
    assert_pool_serves(box)
    return result


def test_infinite_loop_times_out(docker_box):
    result = run_adversary(docker_box, "while True:\n    pass", timeout=1.0)
    assert result.status == Status.TIMEOUT and result.duration >= 1.0


def test_sleep_past_the_timeout(docker_box):
    result = run_adversary(docker_box, "import time\ntime.sleep(60)", timeout=1.0)
    assert result.status == Status.TIMEOUT and result.error_message == "timed out after 1 s"


@pytest.mark.parametrize(
    "source",
    [
        "x = bytearray(8 * 2**30)",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(2**24))",
        "s = 'a'\nwhile True:\n    s = s + s",
    ],
)
def test_memory_bomb(docker_box, source):
    result = run_adversary(docker_box, source, timeout=5.0)
    assert result.status == Status.MEMORY and result.error_type == "MemoryError"


def test_memory_across_processes_hits_the_cgroup_and_replaces_the_container(docker_box):
    # Each process stays under RLIMIT_AS, but together they pass the container's memory
    # limit, so the kernel OOM-kills in the cgroup; the program (largest) goes first.
    source = (
        "import os, time\n"
        "for _ in range(3):\n"
        "    if os.fork() == 0:\n"
        "        block = bytearray(200 * 2**20)\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "block = bytearray(420 * 2**20)\n"
        "time.sleep(30)\n"
    )
    result = docker_box.run_one(Program(source, timeout=8.0))
    assert result.status == Status.MEMORY and result.error_type == "MemoryLimit"
    assert result.extra["tainted"] is True
    client = docker_box._client
    for _ in range(100):  # removal runs in the background
        if not client.containers.list(all=True, filters={"id": result.extra["worker"]}):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the tainted container was not removed")
    assert_pool_serves(docker_box)


@pytest.mark.parametrize(
    "source",
    [
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        # children escape the process group with setsid and keep forking
        "import os\nwhile True:\n    try:\n        if os.fork() == 0:\n            os.setsid()\n"
        "    except OSError:\n        pass",
    ],
)
def test_fork_bomb(docker_box, source):
    result = run_adversary(docker_box, source, timeout=2.0)
    assert result.status == Status.TIMEOUT
    # Nothing of the bomb survives: the next program sees only the server and itself.
    probe = docker_box.run(
        [Program("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")] * 2
    )
    for r in probe:
        pids = eval(r.stdout)  # noqa: S307 - our own program's output
        assert len(pids) == 2 and pids[0] == 1


def test_hundred_megabytes_of_stdout(docker_box):
    result = run_adversary(
        docker_box, "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 2**20)", timeout=10.0
    )
    assert result.status == Status.PASSED and result.stdout_truncated
    assert result.stdout == "x" * docker_box.config.output_cap


def test_host_files_are_invisible(docker_box, tmp_path):
    marker = tmp_path / f"host-{uuid.uuid4().hex}.txt"
    marker.write_text("host secret")
    source = f"print(open({str(marker)!r}).read())"
    result = run_adversary(docker_box, source)
    assert result.status == Status.ERROR and result.error_type == "FileNotFoundError"
    shadow = run_adversary(docker_box, "open('/etc/shadow').read()")
    assert shadow.status == Status.ERROR and shadow.error_type == "PermissionError"


@pytest.mark.parametrize("path", ["/etc/passwd", "/usr/lib/evil.py", "/evil", "/root/x"])
def test_writing_outside_tmp_fails(docker_box, path):
    result = run_adversary(docker_box, f"open({path!r}, 'a').write('x')")
    assert result.status == Status.ERROR
    assert result.error_type in ("OSError", "PermissionError")


def test_writes_in_tmp_and_shm_do_not_outlive_the_program(docker_box):
    docker_box.run([Program("open('/tmp/left', 'w').write('x')\nopen('/dev/shm/left', 'w').write('x')")] * 2)
    results = docker_box.run([Program("import os\nprint(os.listdir('/tmp'), os.listdir('/dev/shm'))")] * 2)
    for result in results:
        tmp_listing, shm_listing = result.stdout.rsplit("] [", 1)
        assert "left" not in tmp_listing and "left" not in shm_listing


def test_network_socket_is_unreachable(docker_box):
    result = run_adversary(docker_box, "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)")
    assert result.status == Status.ERROR and result.error_type == "OSError"
    interfaces = docker_box.run_one("import os\nprint(sorted(os.listdir('/sys/class/net')))")
    assert interfaces.stdout.strip() == "['lo']"


@pytest.mark.parametrize(
    "source",
    [
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        "import os, signal\nos.kill(1, signal.SIGTERM)\nos.kill(1, signal.SIGINT)",
        # kill(-1): every process we may signal but init and ourselves (ESRCH when none)
        "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept ProcessLookupError:\n    pass",
    ],
)
def test_killing_the_parent_is_contained(docker_box, source):
    result = run_adversary(docker_box, source, tests="assert False")
    assert result.status == Status.FAILED  # the server lived on and ran the tests


@pytest.mark.parametrize(
    "source, error_type",
    [
        ("import sys\nsys.exit(0)", "SystemExit"),
        ("import os\nos._exit(0)", "EarlyExit"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "Killed"),
    ],
)
def test_exiting_early_is_killed(docker_box, source, error_type):
    result = run_adversary(docker_box, source, tests="assert False")
    assert result.status == Status.KILLED and result.error_type == error_type


@pytest.mark.parametrize(
    "source",
    [
        "AssertionError = Exception",
        "import builtins\nbuiltins.AssertionError = Exception\nbuiltins.Exception = BaseException",
        "import builtins\nbuiltins.isinstance = lambda *a: False\nbuiltins.repr = lambda *a: 'x'",
        "import os\nos._exit = lambda *a: None\nos.write = lambda fd, data: len(data)",
        "print(\"('0' * 32, 2, 'passed', None, None, 'tests', '', None)\")",
        "import os\nos.write(3, b\"('0' * 32, 2, 'passed', None, None, 'tests', '', None)\\n\")",
        "import threading, os, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.05), os._exit(0))).start()\ntime.sleep(1)",
    ],
)
def test_faking_a_pass_fails(docker_box, source):
    result = run_adversary(docker_box, source, tests="assert 1 == 2")
    assert result.status in (Status.FAILED, Status.KILLED)
