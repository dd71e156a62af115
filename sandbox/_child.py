"""In-sandbox harness: the code a forked child runs to execute one program and its tests.

Stdlib only; it runs inside the sandbox (the container's ``python3`` or the process
backend's interpreter). ``sandbox/_server.py`` forks a child per program and calls
``run_child``; the child never returns: it writes one verdict on the verdict pipe and
leaves with ``os._exit``.

Why a verdict pipe plus a secret: the untrusted program runs in this very process, so
its exit code and its output prove nothing. The verdict is a ``repr`` of plain builtin
values carrying a per-run secret (known to the server), written after the tests finish.
Everything the harness needs after the program has run (``os.write``, ``os._exit``,
``repr``, ``isinstance``, the exception classes, ...) is captured in locals BEFORE the
program runs, and the tests are compiled before it too, so redefining
``AssertionError``, patching ``builtins``/``os``/``json``, printing fake verdicts or
exiting early cannot turn into a pass. A deliberate adversary that introspects the
interpreter (``gc``, frames, trace hooks, ``ctypes``) can still find the secret or edit
the harness's state: in-process checking cannot stop that; see docs/sandbox.md.
"""

import ast
import builtins
import linecache
import os
import random
import resource
import signal
import sys
import traceback

VERDICT_FD = 3
CHILD_SETUP_FAILED = 121  # exit code when the child could not even prepare to run
_TEXT_CAP = 2000  # characters kept per error message / assert text
_TRACEBACK_CAP = 4000
_MAX_OUTCOMES = 1000
# Top-level test statements that only prepare (imports, defs, assignments): run, but not
# reported as asserts unless they raise.
_SETUP_NODES = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
    ast.AugAssign,
)


def _prepare_process(cfg, workdir, out_w, err_w, verdict_w):
    """Isolate the child: own session, pipes on fds 0-3, limits, work dir, clean env."""
    os.setsid()  # own process group: the server kills the whole group on timeout
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.dup2(verdict_w, VERDICT_FD)
    os.closerange(VERDICT_FD + 1, 65536)  # the server's channel to the host included
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.chdir(workdir)
    if cfg.get("run_uid") is not None:  # process backend started as root: drop to nobody
        os.setgroups([])
        os.setgid(cfg["run_gid"])
        os.setuid(cfg["run_uid"])
    limits = [
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, cfg["nofile"]),
        (resource.RLIMIT_CPU, cfg["cpu_seconds"]),
    ]
    if cfg.get("memory_bytes"):
        limits.append((resource.RLIMIT_AS, cfg["memory_bytes"]))
    if cfg.get("fsize_bytes"):
        limits.append((resource.RLIMIT_FSIZE, cfg["fsize_bytes"]))
    if cfg.get("nproc"):
        limits.append((resource.RLIMIT_NPROC, cfg["nproc"]))
    for which, value in limits:
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))
    os.environ.clear()
    os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"})
    random.seed()  # forked children would otherwise share the server's random state


def _compile_tests(tests, per_assert):
    """Compile the tests BEFORE the program runs: a list of (text, code, kind, error).

    kind is "check" (reported as an assert outcome) or "setup"; error is a compile-time
    exception, kept to report when that statement's turn comes.
    """
    if tests is None:
        return []
    units = []
    if isinstance(tests, str):
        if not per_assert:
            linecache.cache["<tests>"] = (len(tests), None, tests.splitlines(True), "<tests>")
            return [(tests, compile(tests, "<tests>", "exec"), "check", None)]
        linecache.cache["<tests>"] = (len(tests), None, tests.splitlines(True), "<tests>")
        tree = ast.parse(tests, "<tests>")  # a SyntaxError here fails the whole block
        for node in tree.body:
            text = ast.get_source_segment(tests, node) or ast.unparse(node)
            code = compile(ast.Module(body=[node], type_ignores=[]), "<tests>", "exec")
            units.append((text, code, "setup" if isinstance(node, _SETUP_NODES) else "check", None))
        return units
    for i, text in enumerate(tests):
        name = f"<test {i}>"
        linecache.cache[name] = (len(text), None, text.splitlines(True), name)
        try:
            units.append((text, compile(text, name, "exec"), "check", None))
        except Exception as err:  # noqa: BLE001 - reported when this statement runs
            units.append((text, None, "check", err))
    return units


def run_child(cfg, request, secret, workdir, out_w, err_w, verdict_w):
    """Body of the forked child. Never returns."""
    _exit = os._exit
    try:
        _prepare_process(cfg, workdir, out_w, err_w, verdict_w)
    except BaseException:  # noqa: BLE001 - report on stderr, the server classifies the exit
        try:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            _exit(CHILD_SETUP_FAILED)

    # Originals, captured before any untrusted code runs (see the module docstring).
    _write, _repr, _isinstance, _len, _type, _str, _exec = os.write, repr, isinstance, len, type, str, exec
    _encode, _decode, _getpid = str.encode, bytes.decode, os.getpid
    my_pid = _getpid()  # processes the program forks run this harness too: they stay silent
    _BaseException, _AssertionError, _MemoryError = BaseException, AssertionError, MemoryError
    _SystemExit, _SyntaxError, _format_exc = SystemExit, SyntaxError, traceback.format_exception
    _settrace, _setprofile, _stdout, _stderr = sys.settrace, sys.setprofile, sys.stdout, sys.stderr
    # Address space released on MemoryError so the verdict can still be built (bytes(n)
    # is calloc'ed: it reserves address space without touching pages).
    reserve = [bytes(1 << 20)]

    def clean(value, cap=_TEXT_CAP):
        """An exact ``str`` (never a subclass with a hostile __repr__), capped."""
        try:
            text = value if _type(value) is _str else _str(value)
            text = _decode(_encode(text, "utf-8", "surrogatepass"), "utf-8", "surrogatepass")
        except _BaseException:  # noqa: BLE001 - hostile __str__
            text = "<unprintable>"
        return text if _len(text) <= cap else text[:cap] + "..."

    def describe(err):
        """(error_type, message) of an exception; SyntaxError gets its line and column."""
        try:
            name = clean(_type(err).__name__, 200)
        except _BaseException:  # noqa: BLE001
            name = "<unknown>"
        if _isinstance(err, _SyntaxError):
            message = f"{clean(err.msg)} (line {clean(err.lineno)}, column {clean(err.offset)})"
        else:
            message = clean(err)
        return name, message

    def trace_text(err):
        try:  # skip the harness's own frame: users want their code's frames
            lines = _format_exc(_type(err), err, err.__traceback__.tb_next)
            return clean("".join(lines)[-_TRACEBACK_CAP:], _TRACEBACK_CAP)
        except _BaseException:  # noqa: BLE001
            return ""

    def classify(err):
        """Status for an exception raised by the program or a test."""
        if _isinstance(err, _SystemExit):
            return "killed"  # an early exit is never a verdict
        if _isinstance(err, _MemoryError):
            return "memory"
        if _isinstance(err, _AssertionError):
            return "failed"
        return "error"

    status, error_type, error_message, phase, trace, outcomes = "passed", None, None, "tests", "", None
    source, per_assert = request["source"], bool(request.get("per_assert"))
    # A copy of builtins: `import builtins; builtins.len = ...` cannot reach the tests.
    namespace = {"__name__": "__sandbox__", "__builtins__": dict(builtins.__dict__)}
    try:
        units = _compile_tests(request.get("tests"), per_assert)
        phase = "program"
        linecache.cache["<program>"] = (len(source), None, source.splitlines(True), "<program>")
        program = compile(source, "<program>", "exec")
    except _BaseException as err:  # noqa: BLE001
        units = []
        status = classify(err)
        error_type, error_message = describe(err)
        if phase == "tests":
            error_message = "in tests: " + error_message
    else:
        try:
            _exec(program, namespace)
        except _BaseException as err:  # noqa: BLE001
            if _isinstance(err, _MemoryError):
                del reserve[:]
            status = classify(err)
            error_type, error_message = describe(err)
            trace = trace_text(err)
            if status == "killed":
                error_message = f"program exited early (SystemExit: {error_message or 0}) before its tests ran"
            units = []
        _settrace(None)
        _setprofile(None)
        if status == "passed":
            phase = "tests"
            outcomes = [] if per_assert else None
        for index, (text, code, kind, compile_err) in enumerate(units):
            err = compile_err
            if err is None:
                try:
                    _exec(code, namespace)
                except _BaseException as raised:  # noqa: BLE001
                    err = raised
                _settrace(None)
                _setprofile(None)
            if err is None:
                if outcomes is not None and kind == "check" and _len(outcomes) < _MAX_OUTCOMES:
                    outcomes.append((index, clean(text), True, None, None))
                continue
            if _isinstance(err, _MemoryError):
                del reserve[:]
            verdict = classify(err)
            etype, emsg = describe(err)
            if verdict == "killed":
                emsg = f"exited early (SystemExit: {emsg or 0}) during the tests"
            if outcomes is not None and _len(outcomes) < _MAX_OUTCOMES:
                outcomes.append((index, clean(text), False, etype, emsg))
            if status == "passed":  # the first failure decides the status
                status, error_type, error_message, trace = verdict, etype, emsg, trace_text(err)
            if outcomes is None or verdict in ("killed", "memory"):
                break  # a block stops at its first failure; exits and memory stop everything
    try:  # the program's buffered output belongs before the verdict
        _stdout.flush()
        _stderr.flush()
    except _BaseException:  # noqa: BLE001
        pass
    if _getpid() != my_pid:
        _exit(0)
    # One line (repr never emits a raw newline) of plain builtin values.
    message = _repr((secret, my_pid, status, error_type, error_message, phase, trace, outcomes))
    data = _encode(message + "\n", "utf-8", "surrogatepass")
    while data:
        data = data[_write(VERDICT_FD, data) :]
    _exit(0)
