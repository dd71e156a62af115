"""Docker backend: container lock-down, the warm pool, and container lifecycle."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from sandbox import Program, Sandbox, Status
from sandbox.docker_backend import LABEL, remove_stale_containers
from sandbox.image import docker_client

pytestmark = pytest.mark.docker

PROBE = """
import os, resource
status = open('/proc/self/status').read()
fields = dict(line.split(':', 1) for line in status.splitlines())
cg = '/sys/fs/cgroup/'
def read(*names):
    for name in names:
        try:
            return open(cg + name).read().strip()
        except OSError:
            pass
print(os.getuid(), os.getgid())
print(fields['CapEff'].strip(), fields['NoNewPrivs'].strip())
st = os.statvfs('/tmp')
print(st.f_blocks * st.f_frsize // 2**20)
print(read('memory.max', 'memory/memory.limit_in_bytes'), read('memory.swap.max', 'memory/memory.memsw.limit_in_bytes'))
print(read('pids.max', 'pids/pids.max'))
print(resource.getrlimit(resource.RLIMIT_AS)[0] // 2**20)
print(os.getcwd().startswith('/tmp/'))
"""


def test_container_is_locked_down(docker_box):
    result = docker_box.run_one(PROBE)
    assert result.status == Status.PASSED, result.stderr
    lines = result.stdout.splitlines()
    config = docker_box.config
    assert lines[0] == "65534 65534"  # non-root
    assert lines[1] == "0000000000000000 1"  # no capabilities, no-new-privileges
    assert int(lines[2]) == config.tmpfs_mb  # size-capped work dir
    memory = (config.memory_mb + config.tmpfs_mb + 64) << 20
    mem, memsw = lines[3].split()
    assert int(mem) == memory and int(memsw) == memory  # memory+swap == memory: no swap
    assert lines[4] == str(config.pids)
    assert int(lines[5]) == config.memory_mb  # RLIMIT_AS per program
    assert lines[6] == "True"  # a fresh work dir under the tmpfs
    container = docker_box._client.containers.get(result.extra["worker"])
    host = container.attrs["HostConfig"]
    assert host["ReadonlyRootfs"] and host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    assert host["NanoCpus"] == int(config.cpus * 1e9)


def test_pool_reuses_warm_containers_with_fresh_processes(docker_box):
    results = docker_box.run([Program("import os\nprint(os.getpid(), os.getcwd())")] * 12)
    workers = {r.extra["worker"] for r in results}
    assert len(workers) <= docker_box.config.pool_size  # bounded by the pool
    seen = {}  # within one container, every program had its own process and work dir
    for r in results:
        seen.setdefault(r.extra["worker"], []).append(tuple(r.stdout.split()))
    for runs in seen.values():
        assert len({pid for pid, _ in runs}) == len(runs)
        assert len({cwd for _, cwd in runs}) == len(runs)


def test_programs_can_use_common_stdlib_modules(docker_box):
    source = (
        "import json, re, math, collections, itertools, functools, heapq, fractions, "
        "decimal, statistics, datetime, typing, hashlib, random, string, unicodedata\n"
        "print(json.dumps({'a': math.gcd(12, 18)}), hashlib.sha1(b'x').hexdigest()[:4])"
    )
    result = docker_box.run_one(source)
    assert result.status == Status.PASSED and result.stdout == '{"a": 6} 11f6\n'


OWNER_SCRIPT = """
import os, signal, sys
from sandbox import Sandbox
box = Sandbox(backend="docker", pool_size=1)
assert box.run_one("print(1)").passed
print("ready", os.getpid(), flush=True)
if sys.argv[1] == "crash":
    os.kill(os.getpid(), signal.SIGKILL)  # no close, no atexit
"""


def _containers_of(client, pid):
    return client.containers.list(all=True, filters={"label": f"{LABEL}.owner_pid={pid}"})


def test_close_atexit_and_stale_cleanup(docker_box):
    client = docker_client()
    ours = {c.id for c in _containers_of(client, os.getpid())}
    assert len(ours) >= 1  # the live session pool

    normal = subprocess.run([sys.executable, "-c", OWNER_SCRIPT, "exit"], capture_output=True, text=True, timeout=120)
    assert "ready" in normal.stdout, normal.stderr
    assert _containers_of(client, int(normal.stdout.split()[1])) == []  # removed at interpreter exit

    crashed = subprocess.run([sys.executable, "-c", OWNER_SCRIPT, "crash"], capture_output=True, text=True, timeout=120)
    assert crashed.returncode == -signal.SIGKILL and "ready" in crashed.stdout
    crashed_pid = int(crashed.stdout.split()[1])
    assert len(_containers_of(client, crashed_pid)) == 1  # left behind by the crash
    removed = remove_stale_containers(client)
    assert len(removed) >= 1
    assert _containers_of(client, crashed_pid) == []
    # a live owner's pool is never touched
    assert ours <= {c.id for c in _containers_of(client, os.getpid())}
    assert docker_box.run_one("print(2)").stdout == "2\n"


def test_close_removes_the_pool():
    box = Sandbox(backend="docker", pool_size=2).start()
    ids = {r.extra["worker"] for r in box.run(["pass"] * 4)}
    client = box._client
    assert all(client.containers.list(all=True, filters={"id": i}) for i in ids)
    box.close()
    assert not any(client.containers.list(all=True, filters={"id": i}) for i in ids)


def test_auto_backend_picks_docker():
    with Sandbox(backend="auto", pool_size=1) as box:
        assert box.backend == "docker"
        assert box.run_one("print('hi')").backend == "docker"


def test_cli_status_reports_image_and_containers(docker_box):
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, "-m", "comlrl_core.cli", "sandbox", "status"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "present" in out.stdout and "owner alive" in out.stdout


def test_wait_for_replacement_after_lost_server(docker_box):
    # Break a worker from outside (as if its container died): the next program runs on a
    # replacement (more fault cases in test_docker_faults.py).
    box = Sandbox(backend="docker", pool_size=1).start()
    try:
        first = box.run_one("pass")
        container = box._client.containers.get(first.extra["worker"])
        container.kill()
        # the engine's own event: returns once the container stopped, raises after 30 s
        assert container.wait(timeout=30, condition="not-running")["StatusCode"] != 0
        again = box.run_one("print(3)")
        assert again.status == Status.PASSED and again.stdout == "3\n"
        assert again.extra["worker"] != first.extra["worker"]
    finally:
        box.close()


def test_server_memory_is_out_of_reach(docker_box):
    # The fork server is not dumpable: same-uid programs cannot read (or ptrace) it.
    result = docker_box.run_one("open('/proc/1/environ').read()")
    assert result.status == Status.ERROR and result.error_type == "PermissionError"


def test_each_program_gets_fresh_random_state(docker_box):
    # Forked from one server, children would share its random state without CPython's
    # at-fork reseed: six programs on one worker must draw six different values.
    results = docker_box.run([Program("import random\nprint(random.getrandbits(64))")] * 6)
    assert len({r.stdout for r in results}) == 6
