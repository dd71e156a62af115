"""Fork server: runs inside the sandbox and executes one program per request.

Stdlib only. It is started once per pool slot (``python3 -I -c SOURCE CONFIG_JSON``,
where SOURCE is ``_child.py`` + this file, see ``sandbox.protocol.server_source``) and
pre-imports the stdlib modules programs commonly use, so each program costs one
``fork`` instead of a new interpreter.

Protocol, on the server's stdin/stdout: each message is a 4-byte big-endian length
followed by UTF-8 JSON. The server first sends ``{"ready": true, ...}``; then for each
request ``{"id", "source", "tests", "per_assert", "timeout"}`` it answers one reply
(status, errors, asserts, capped stdout/stderr, duration, ``tainted``).

Per program: a fresh work dir, a fresh forked process in its own session with rlimits,
output read through pipes with a cap (the rest is drained and dropped), the whole
process group killed when it ends or times out. Inside a container the server is PID 1:
signals from the program are ignored (no handler), and after each run every other
process in the container is killed with ``kill(-1)``, so nothing survives a run; if
something does, or the container's cgroup OOM-killed a process, the reply says
``tainted`` and the host replaces the container.

Test suites are compiled once in the server and reused by every program that shares one
(``_compiled_tests``); the program itself is always compiled in its child.

Verdicts: the server draws a seed per program (the child derives per-unit pass tokens
from it, see _child.py) and builds the verdict from the verdict pipe: the child's plan
(first line, written before untrusted code), the tokens that arrived (a unit passed only
with its exact token) and the runner's untrusted failure details.
"""

import ast
import gc
import json
import os
import select
import shutil
import signal
import struct
import sys
import tempfile
import time

if "run_child" not in globals():  # imported as a module; the -c source concatenates _child.py
    from sandbox._child import CHILD_SETUP_FAILED, compile_tests, prepare_server, run_child, token_for

_HEADER = struct.Struct(">I")
_VERDICT_CAP = 1 << 20
_STATUSES = ("passed", "failed", "error", "timeout", "memory", "killed")
_FAILURES = ("failed", "error", "memory", "killed")  # what a unit's (untrusted) detail may say
_MAX_OUTCOMES = 1000
# Compiled test suites kept by the server: an RL batch runs many programs against each suite.
_TESTS_CACHE_ENTRIES = 256
_TESTS_CACHE_CHARS = 1 << 20  # total test text behind the cached entries
_TESTS_ENTRY_CHARS = 64 * 1024  # a larger suite is compiled in each child, as any suite was before
# (per_assert, tests as str or tuple) -> (units, characters), least recently used first
_tests_cache: dict[tuple, tuple[list, int]] = {}


def _read_exact(size):
    chunks = []
    while size:
        data = os.read(0, min(size, 1 << 20))
        if not data:
            return None
        chunks.append(data)
        size -= len(data)
    return b"".join(chunks)


def _recv():
    header = _read_exact(_HEADER.size)
    if header is None:
        return None
    body = _read_exact(_HEADER.unpack(header)[0])
    return None if body is None else json.loads(body)


def _send(message):
    body = json.dumps(message).encode()
    data = memoryview(_HEADER.pack(len(body)) + body)
    while data:
        data = data[os.write(1, data) :]


def _open_oom_counter():
    """A descriptor on the container cgroup's OOM-kill counter file (cgroup v2 or v1), or None.

    Kept open and re-read with ``pread`` (two reads per program: opening the file each time
    cost more than the read). Children close it (``closerange``) before any program runs.
    """
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        if _oom_kills(fd) is not None:
            return fd
        os.close(fd)
    return None


def _oom_kills(fd):
    """The OOM-kill count in the counter file fd, or None (no counter, unreadable)."""
    if fd is None:
        return None
    try:
        text = os.pread(fd, 4096, 0)
    except OSError:
        return None
    for line in text.split(b"\n"):
        key, _, value = line.partition(b" ")
        if key == b"oom_kill":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _reap():
    """Collect every exited child (as PID 1, orphans of the program become ours)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _other_pids():
    me = os.getpid()
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) != me]


def _kill_strays():
    """PID 1 only: kill every other process in the container; False if some survive."""
    for _ in range(100):
        _reap()
        if not _other_pids():
            return True
        try:
            os.kill(-1, signal.SIGKILL)  # all processes we may signal, except PID 1 (us)
        except ProcessLookupError:
            pass
        time.sleep(0.002)
    _reap()
    return not _other_pids()


def _clean_dir(path):
    """Remove everything in path (the program may have written anywhere writable)."""
    try:
        entries = os.listdir(path)
    except OSError:
        return True
    for name in entries:
        full = os.path.join(path, name)
        try:
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
        except OSError:
            pass
    try:
        return not os.listdir(path)
    except OSError:
        return True


def _collect(pid, fds, deadline, caps):
    """Read the child's pipes until it exits or the deadline passes.

    Returns (exited, buffers, truncated, wait status if already reaped); output past a cap is read and dropped, so a
    chatty program never blocks on a full pipe.
    """
    buffers = {fd: bytearray() for fd in fds}
    truncated = {fd: False for fd in fds}
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    try:
        pidfd = os.pidfd_open(pid)
        poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):
        pidfd = None  # old kernel: fall back to a 10 ms waitpid tick
    exited = False
    try:
        while not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            tick = remaining if pidfd is not None else min(remaining, 0.01)
            for fd, _ in poller.poll(max(1, int(tick * 1000) + 1)):
                if fd == pidfd:
                    exited = True
                    continue
                data = os.read(fd, 65536)
                if not data:
                    poller.unregister(fd)
                    continue
                room = caps[fd] - len(buffers[fd])
                if len(data) > room:
                    truncated[fd] = True
                    data = data[: max(room, 0)]
                buffers[fd] += data
            if pidfd is None:
                done, wait_status = os.waitpid(pid, os.WNOHANG)
                if done == pid:
                    return True, buffers, truncated, wait_status
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return exited, buffers, truncated, None


def _drain(fds, buffers, truncated, caps):
    """Read what is left in the pipes without blocking (writers are dead by now)."""
    for fd in fds:
        os.set_blocking(fd, False)
        while True:
            try:
                data = os.read(fd, 65536)
            except (BlockingIOError, OSError):
                break
            if not data:
                break
            room = caps[fd] - len(buffers[fd])
            if len(data) > room:
                truncated[fd] = True
                data = data[: max(room, 0)]
            buffers[fd] += data


def _parse_line(line):
    try:
        return ast.literal_eval(line.decode("utf-8", "surrogatepass"))
    except Exception:  # noqa: BLE001 - anything malformed is tampering
        return None


def _parse_verdict(raw, seed, per_assert):
    """(verdict dict or None, tampered flag) from the lines on the verdict pipe.

    The first line is the child's plan (or its compile error), written before any
    untrusted code ran. A unit passed only if its token line is there; a token line with
    a wrong token, or any line that is neither a token nor a well-formed failure detail,
    is tampering. Failure details are the runner's (untrusted) account of a failure: they
    can describe a failure, never make a pass. None without tampering means the child
    ended before its units finished (the exit status then decides).
    """
    lines = [line for line in bytes(raw).split(b"\n") if line]
    if not lines:
        return None, False
    head = _parse_line(lines[0])
    if type(head) is tuple and len(head) == 5 and head[0] == "compile" and len(lines) == 1:
        _, status, etype, emsg, phase = head
        if status not in _STATUSES:
            return None, True
        verdict = {"status": status, "error_type": etype, "error_message": emsg, "asserts": None}
        return dict(verdict, extra={"phase": phase, "traceback": ""}), False
    if not (type(head) is tuple and len(head) == 3 and head[0] == "plan" and type(head[1]) is list):
        return None, True
    plan, n_units = head[1], head[2]
    passed: set[int] = set()
    details: dict[int, tuple] = {}
    for line in lines[1:]:
        if line.startswith(b"T"):
            unit_text, _, token = line[1:].partition(b":")
            try:
                unit = int(unit_text)
            except ValueError:
                return None, True
            if not 0 <= unit <= n_units or token != token_for(seed, unit).encode():
                return None, True
            passed.add(unit)
            continue
        detail = _parse_line(line)
        if not (type(detail) is tuple and len(detail) == 6 and detail[0] == "unit" and detail[2] in _FAILURES):
            return None, True
        details.setdefault(detail[1], detail)
    return _combine(plan, n_units, passed, details, per_assert)


def _combine(plan, n_units, passed, details, per_assert):
    """The verdict from the units that passed (tokens) and the failures' details."""
    if 0 not in passed:  # the program itself did not finish
        detail = details.get(0)
        if detail is None:
            return None, False
        _, _, status, etype, emsg, trace = detail
        if status == "killed":
            emsg = f"program exited early (SystemExit: {emsg or 0}) before its tests ran"
        extra = {"phase": "program", "traceback": trace}
        return {"status": status, "error_type": etype, "error_message": emsg, "asserts": None, "extra": extra}, False
    status, etype, emsg, trace = "passed", None, None, ""
    outcomes: list[dict] | None = [] if per_assert else None
    for unit in range(1, n_units + 1):
        text, kind = plan[unit - 1] if unit <= len(plan) else ("", "check")
        if unit in passed:
            if outcomes is not None and kind == "check" and len(outcomes) < _MAX_OUTCOMES:
                outcomes.append(
                    {"index": unit - 1, "text": text, "passed": True, "error_type": None, "error_message": None}
                )
            continue
        detail = details.get(unit)
        if detail is None:
            return None, False  # the child ended inside this unit: its exit status decides
        _, _, verdict, detail_type, detail_message, detail_trace = detail
        if verdict == "killed":
            detail_message = f"exited early (SystemExit: {detail_message or 0}) during the tests"
        if outcomes is not None and len(outcomes) < _MAX_OUTCOMES:
            outcomes.append(
                {
                    "index": unit - 1,
                    "text": text,
                    "passed": False,
                    "error_type": detail_type,
                    "error_message": detail_message,
                }
            )
        if status == "passed":  # the first failure decides the status
            status, etype, emsg, trace = verdict, detail_type, detail_message, detail_trace
        if outcomes is None or verdict in ("killed", "memory"):
            break
    if status == "passed" and len(passed) != n_units + 1:  # unreachable: a pass needs every token
        return None, True
    extra = {"phase": "tests", "traceback": trace}
    return {"status": status, "error_type": etype, "error_message": emsg, "asserts": outcomes, "extra": extra}, False


def _compiled_tests(tests, per_assert):
    """The compiled units of a test suite (``compile_tests``), cached; None: the child compiles.

    Compiling runs no code, and the units are only read in the children (each has its own
    copy of the server's memory). Only suites that compile without any error are cached, so
    no exception object (whose traceback would reach server frames) is handed to a child;
    a suite that fails to compile is compiled, and its error reported, in the child as before.
    """
    key: tuple
    if isinstance(tests, str):
        key, size = (per_assert, tests), len(tests)
    elif isinstance(tests, list) and all(isinstance(t, str) for t in tests):
        key, size = (per_assert, tuple(tests)), sum(len(t) for t in tests)
    else:
        return None
    if size > _TESTS_ENTRY_CHARS:
        return None
    entry = _tests_cache.pop(key, None)
    if entry is None:
        try:
            entry = (compile_tests(tests, per_assert), size)
        except Exception:  # noqa: BLE001 - the child compiles again and reports it
            return None
        if any(unit[3] is not None for unit in entry[0]):
            return None
        cached_chars = sum(cached_size for _, cached_size in _tests_cache.values())
        while _tests_cache and (len(_tests_cache) >= _TESTS_CACHE_ENTRIES or cached_chars + size > _TESTS_CACHE_CHARS):
            cached_chars -= _tests_cache.pop(next(iter(_tests_cache)))[1]  # the least recently used
    _tests_cache[key] = entry  # (re)inserted last: the most recently used
    return entry[0]


def _exit_verdict(wait_status, oom):
    """Status for a child that died without a valid verdict."""
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        name = signal.Signals(sig).name if sig in signal.Signals.__members__.values() else str(sig)
        if sig == signal.SIGXCPU:
            return "timeout", "CpuTimeLimit", "CPU time limit exceeded"
        if oom:
            return "memory", "MemoryLimit", f"killed by the out-of-memory killer ({name})"
        return "killed", "Killed", f"killed by signal {name} before reporting a verdict"
    code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else -1
    if code == CHILD_SETUP_FAILED:
        return "killed", "SandboxError", "the sandbox could not prepare the program (see stderr)"
    return "killed", "EarlyExit", f"exited with code {code} before its tests finished (no verdict)"


def _run(cfg, request):
    timeout = float(request["timeout"])
    run_cfg = dict(cfg, cpu_seconds=int(timeout) + 2)  # CPU cap: escaped processes die too
    compiled_tests = _compiled_tests(request.get("tests"), bool(request.get("per_assert")))
    seed_box = [os.urandom(32)]  # the child pops it: no frame of the child keeps the seed
    workdir = tempfile.mkdtemp(prefix="run-", dir=cfg["work_root"])
    if cfg.get("run_uid") is not None:
        os.chown(workdir, cfg["run_uid"], cfg["run_gid"])
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    verdict_r, verdict_w = os.pipe()
    oom_fd = cfg.get("oom_fd")
    oom_before = _oom_kills(oom_fd)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child
        try:
            for fd in (out_r, err_r, verdict_r):
                os.close(fd)
            run_child(run_cfg, request, seed_box, workdir, out_w, err_w, verdict_w, compiled_tests)
        finally:
            os._exit(CHILD_SETUP_FAILED)
    for fd in (out_w, err_w, verdict_w):
        os.close(fd)
    fds = (out_r, err_r, verdict_r)
    caps = {out_r: cfg["output_cap"], err_r: cfg["output_cap"], verdict_r: _VERDICT_CAP}
    exited, buffers, truncated, wait_status = _collect(pid, fds, start + timeout, caps)
    duration = time.monotonic() - start
    try:
        os.killpg(pid, signal.SIGKILL)  # the whole group: the child and anything it forked
    except (ProcessLookupError, PermissionError):
        pass
    if wait_status is None:
        wait_status = os.waitpid(pid, 0)[1]
    tainted = False
    if os.getpid() == 1:
        tainted = not _kill_strays()
    else:
        _reap()
    _drain(fds, buffers, truncated, caps)
    for fd in fds:
        os.close(fd)
    oom = oom_before is not None and (_oom_kills(oom_fd) or 0) > oom_before
    verdict, tampered = _parse_verdict(buffers[verdict_r], seed_box[0], bool(request.get("per_assert")))
    if not exited:
        verdict = {
            "status": "timeout",
            "error_type": "Timeout",
            "error_message": f"timed out after {timeout:g} s",
            "asserts": None,
            "extra": {},
        }
    elif verdict is None and tampered:
        verdict = {
            "status": "killed",
            "error_type": "Tampered",
            "error_message": "the verdict channel was written to by the program",
            "asserts": None,
            "extra": {},
        }
    elif verdict is None:
        status, etype, emsg = _exit_verdict(wait_status, oom)
        tainted = tainted or etype == "SandboxError"
        verdict = {"status": status, "error_type": etype, "error_message": emsg, "asserts": None, "extra": {}}
    verdict["extra"]["exit"] = (
        f"signal {os.WTERMSIG(wait_status)}" if os.WIFSIGNALED(wait_status) else f"code {os.WEXITSTATUS(wait_status)}"
    )
    shutil.rmtree(workdir, ignore_errors=True)
    for path in cfg.get("clean_dirs", ()):
        tainted = not _clean_dir(path) or tainted
    if oom:
        tainted = True  # the cgroup hit its limit: start from a fresh container
    verdict.update(
        id=request.get("id"),
        duration=duration,
        tainted=tainted,
        stdout=bytes(buffers[out_r]).decode("utf-8", "replace"),
        stderr=bytes(buffers[err_r]).decode("utf-8", "replace"),
        stdout_truncated=truncated[out_r],
        stderr_truncated=truncated[err_r],
    )
    return verdict


def main():
    cfg = json.loads(sys.argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the host is not ours
    for name in cfg.get("preimport", ()):
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a missing optional module is fine
            pass
    gc.collect()
    gc.freeze()  # children's GC then skips the server's objects: far fewer copy-on-write faults
    # Never load ctypes here: a child could re-create an already loaded extension module
    # without an import audit event. (Docker's image makes the interpreter non-dumpable.)
    os.makedirs(cfg["work_root"], exist_ok=True)
    cfg["devnull_fd"] = prepare_server()
    cfg["oom_fd"] = _open_oom_counter() if cfg.get("container") else None
    _send(
        {"ready": True, "pid": os.getpid(), "python": sys.version.split()[0], "oom_counter": cfg["oom_fd"] is not None}
    )
    while True:
        request = _recv()
        if request is None:
            return
        try:
            reply = _run(cfg, request)
        except Exception as err:  # noqa: BLE001 - the server must answer every request
            reply = {
                "id": request.get("id"),
                "status": "killed",
                "error_type": "SandboxError",
                "error_message": f"sandbox server failed: {type(err).__name__}: {err}",
                "asserts": None,
                "stdout": "",
                "stderr": "",
                "stdout_truncated": False,
                "stderr_truncated": False,
                "duration": 0.0,
                "tainted": True,
                "extra": {},
            }
        _send(reply)


if __name__ == "__main__":
    main()
