"""In-sandbox harness: the code a forked child runs to execute one program and its tests.

Stdlib only; it runs inside the sandbox (the container's ``python3`` or the process
backend's interpreter). ``sandbox/_server.py`` forks a child per program and calls
``run_child``; the child never returns: it leaves with ``os._exit``.

Why no program can write its own pass
-------------------------------------
The program runs in this very process, so nothing it can reach may be able to produce a
pass. A pass is a per-unit TOKEN (unit 0 is the program, unit k the k-th test statement
or block) derived from a seed only the server and this child know. Before any untrusted
code runs, ``_launch`` turns the seed into tokens and builds one iterator of C-level
objects (``map``/``compress``/``takewhile``/``partial``) that calls the runner for each
unit and writes that unit's token to the verdict pipe only when the runner returned its
literal "passed" selectors (``exec`` returned normally). The iterator is consumed without
ever being bound to a name, so while user code runs the tokens are held only by C-level
objects:
- no frame holds them: the runner's and the harness's frames (what ``f_back`` walks,
  tracebacks and signal handlers reach) hold code objects, the namespace and the unit
  number; the runner's closure cells are unreachable (the function itself is referenced
  only by the iterators);
- ``gc.get_objects``/``get_referrers``/``get_referents``, ``ctypes``, crafted code objects
  (``code.__new__``, ``marshal``), tracing (which could jump past an ``assert``), new audit
  hooks and ``/proc/*/mem``/``/proc/*/fd`` are refused by an audit hook (PEP 578) that is
  installed before the program runs and that no Python code can remove;
- in Docker the interpreter is execute-only, so the process is not dumpable: its
  ``/proc/self/mem`` is root's and no other process can read its memory.
Failure details (error type, message, traceback) are written by the runner and are
untrusted: they can only describe a failure, never make one a pass.
"""

import ast
import builtins
import collections
import functools
import hashlib
import itertools
import linecache
import operator
import os
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
# What the audit hook refuses while user code runs (see the module docstring).
DENIED_EVENTS = frozenset(
    {
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "sys.settrace",
        "sys.setprofile",
        "sys._settraceallthreads",
        "sys._setprofileallthreads",
        "sys.addaudithook",
        "marshal.load",
        "marshal.loads",
    }
)
DENIED_MODULES = frozenset(
    {
        "ctypes",
        "_ctypes",
        "cffi",
        "_cffi_backend",
        "_testcapi",
        "_testinternalcapi",
        "_testbuffer",
        "_testmultiphase",
        "_testsinglephase",
        "_testimportmultiple",
        "_xxsubinterpreters",
        "_xxinterpchannels",
        "_xxtestfuzz",
    }
)
_PROC_DENIED_PARTS = frozenset({"mem", "pagemap", "map_files", "fd", "fdinfo"})


def token_for(seed, unit):
    """The pass token of one unit (0 = the program): known to the server and the child only."""
    return hashlib.sha256(seed + unit.to_bytes(4, "big")).hexdigest()[:32]


def token_line(seed, unit):
    return b"T%d:%s\n" % (unit, token_for(seed, unit).encode())


def install_guard():
    """Install the audit hook that refuses the means to read or forge a token."""
    realpath, fspath, isabs, sep = os.path.realpath, os.fspath, os.path.isabs, os.sep
    denied_events, denied_modules, proc_parts = DENIED_EVENTS, DENIED_MODULES, _PROC_DENIED_PARTS
    _str, _bytes, _type, _frozenset, _getframe = str, bytes, type, frozenset, sys._getframe
    # types.coroutine sets a flag with code.replace (asyncio uses it): the bytecode stays
    # the compiler's, so that caller may build code objects; nothing else may.
    coroutine_code = __import__("types").coroutine.__code__

    def refuse_path(path):
        if _type(path) is int:
            return False  # an already open descriptor
        if _type(path) is _bytes:
            path = path.decode("utf-8", "surrogateescape")
        elif _type(path) is not _str:
            path = fspath(path)  # a PathLike runs in the caller's thread: that is fine
            if _type(path) is _bytes:
                path = path.decode("utf-8", "surrogateescape")
        if _type(path) is not _str:
            return True
        parts = _frozenset(path.split(sep))
        if not isabs(path):
            return bool(parts & proc_parts)  # may be relative to a /proc dir_fd
        full = realpath(path)
        return (path.startswith("/proc/") or full.startswith("/proc/") or path.startswith("/dev/fd")) and bool(
            (parts | _frozenset(full.split(sep))) & proc_parts
        )

    def guard(event, args):
        if event in denied_events or event.startswith("ctypes."):
            raise RuntimeError(f"the sandbox does not permit {event}")
        if event == "code.__new__":
            if _getframe(1).f_code is not coroutine_code:
                raise RuntimeError("the sandbox does not permit building code objects")
        elif event == "import":
            name = args[0]
            if _type(name) is _str and name.partition(".")[0] in denied_modules:
                raise ImportError(f"the sandbox does not permit importing {name}")
        elif event == "open" and args and refuse_path(args[0]):
            raise PermissionError(f"the sandbox does not permit opening {args[0]!r}")

    sys.addaudithook(guard)


BASE_ENVIRONMENT = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def prepare_server():
    """Once, in the server before its first fork: what every child would otherwise redo.

    The environment becomes ``BASE_ENVIRONMENT`` (each child adds only its HOME and
    TMPDIR), SIGTERM and SIGCHLD get their default action (each child resets only SIGINT,
    which the server ignores), and /dev/null is opened for the children's stdin. Returns
    that descriptor; each child moves it to fd 0 and closes the original.
    """
    os.environ.clear()
    os.environ.update(BASE_ENVIRONMENT)
    for sig in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)  # no Python-level handler: no code runs on a signal
    return os.open(os.devnull, os.O_RDONLY)


def _prepare_process(cfg, workdir, out_w, err_w, verdict_w):
    """Isolate the child: own session, pipes on fds 0-3, limits, work dir, clean env.

    Relies on ``prepare_server`` having run in the server (``cfg["devnull_fd"]``).
    """
    os.setsid()  # own process group: the server kills the whole group on timeout
    os.dup2(cfg["devnull_fd"], 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.dup2(verdict_w, VERDICT_FD)
    os.closerange(VERDICT_FD + 1, 65536)  # the server's channel to the host included
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # the server ignores it; SIGTERM/SIGCHLD: prepare_server
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
        _soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))
    environ = os.environ  # BASE_ENVIRONMENT already (prepare_server), plus the child's own dirs
    environ["HOME"] = environ["TMPDIR"] = workdir
    # random needs no reseeding here: CPython reseeds it in every forked child (at-fork hook).
    # Modules not preloaded by the server compile from source: cached bytecode would need
    # marshal, which the guard refuses (a crafted .pyc is arbitrary memory access).
    sys.dont_write_bytecode = True
    sys.pycache_prefix = "/nonexistent/comlrl-sandbox-pycache"


def register_test_lines(tests):
    """Put the tests' text in linecache, so tracebacks through them show their lines."""
    if isinstance(tests, str):
        linecache.cache["<tests>"] = (len(tests), None, tests.splitlines(True), "<tests>")
    elif tests is not None:
        for i, text in enumerate(tests):
            name = f"<test {i}>"
            linecache.cache[name] = (len(text), None, text.splitlines(True), name)


def compile_tests(tests, per_assert):
    """Compile the tests BEFORE the program runs: a list of (text, code, kind, error).

    kind is "check" (reported as an assert outcome) or "setup"; error is a compile-time
    exception, kept to report when that statement's turn comes. Pure: the server also
    calls it, to compile a test suite once for every program that shares it.
    """
    if tests is None:
        return []
    units: list[tuple[str, object, str, Exception | None]] = []
    if isinstance(tests, str):
        if not per_assert:
            return [(tests, compile(tests, "<tests>", "exec"), "check", None)]
        tree = ast.parse(tests, "<tests>")  # a SyntaxError here fails the whole block
        for node in tree.body:
            text = ast.get_source_segment(tests, node) or ast.unparse(node)
            code = compile(ast.Module(body=[node], type_ignores=[]), "<tests>", "exec")
            units.append((text, code, "setup" if isinstance(node, _SETUP_NODES) else "check", None))
        return units
    for i, text in enumerate(tests):
        name = f"<test {i}>"
        try:
            units.append((text, compile(text, name, "exec"), "check", None))
        except Exception as err:  # noqa: BLE001 - reported when this statement runs
            units.append((text, None, "check", err))
    return units


def _make_runner(per_assert):
    """The function each unit's thread runs: exec one unit, report a failure's details.

    It returns the selectors of its unit: (write the pass token, stop here). Whether it
    selects the token depends only on whether ``exec`` returned (the tuples are literals),
    never on a value the program could reach. Everything it uses is captured here, before
    any untrusted code runs, and the function itself is reachable only through C-level
    iterators (so its closure cells are out of the program's reach).
    """
    _write, _repr, _isinstance, _len, _type, _str, _exec = os.write, repr, isinstance, len, type, str, exec
    _encode, _decode = str.encode, bytes.decode
    _BaseException, _AssertionError, _MemoryError = BaseException, AssertionError, MemoryError
    _SystemExit, _SyntaxError, _format_exc = SystemExit, SyntaxError, traceback.format_exception
    # Address space released on MemoryError so the details can still be built (bytes(n)
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
            return name, f"{clean(err.msg)} (line {clean(err.lineno)}, column {clean(err.offset)})"
        return name, clean(err)

    def trace_text(err):
        try:  # skip the runner's own frame: users want their code's frames
            lines = _format_exc(_type(err), err, err.__traceback__.tb_next)
            return clean("".join(lines)[-_TRACEBACK_CAP:], _TRACEBACK_CAP)
        except _BaseException:  # noqa: BLE001
            return ""

    def classify(err):
        if _isinstance(err, _SystemExit):
            return "killed"  # an early exit is never a verdict
        if _isinstance(err, _MemoryError):
            return "memory"
        if _isinstance(err, _AssertionError):
            return "failed"
        return "error"

    def run_unit(unit, code, compile_error, namespace):
        err = compile_error
        if err is None:
            try:
                _exec(code, namespace)
            except _BaseException as raised:  # noqa: BLE001
                err = raised
            else:
                return (True, False)  # literal selectors (write the token, stop): no cell decides a pass
        try:
            if _isinstance(err, _MemoryError):
                del reserve[:]
            status = classify(err)
            etype, emsg = describe(err)
            detail = ("unit", unit, status, etype, emsg, trace_text(err) if compile_error is None else "")
            _write(VERDICT_FD, _encode(_repr(detail) + "\n", "utf-8", "surrogatepass"))
        except _BaseException:  # noqa: BLE001 - details are best effort; the chain goes on
            status = "error"
        if unit > 0 and per_assert and status in ("failed", "error"):
            return (False, False)  # the next statement still runs
        return (False, True)

    return run_unit


def _launch(program, units, runner, namespace, seed_box):
    """The iterator that runs every unit, tokens inside; nothing else keeps a reference.

    Per unit: ``compress((write token, STOP), selectors)`` where the selectors come from
    calling the runner lazily; all units are chained and cut at the first STOP by
    ``takewhile``; ``map(call, ...)`` performs the token writes. The caller consumes the
    result without binding it to a name, so once this frame is gone the seed and the
    tokens are held only by C-level iterator objects that no Python name or attribute
    reaches (``gc`` is refused).
    """
    # methodcaller rather than operator.call (Python 3.11+): the process backend runs the host's 3.10+
    call, partial, compress = operator.methodcaller("__call__"), functools.partial, itertools.compress
    flatten, write, seed = itertools.chain.from_iterable, os.write, seed_box.pop()
    stop = object()
    per_unit = []
    for unit in range(len(units) + 1):
        code, compile_error = (units[unit - 1][1], units[unit - 1][3]) if unit else (program, None)
        selectors = flatten(map(call, (partial(runner, unit, code, compile_error, namespace),)))
        per_unit.append(compress((partial(write, VERDICT_FD, token_line(seed, unit)), stop), selectors))
    return map(call, itertools.takewhile(partial(operator.is_not, stop), flatten(per_unit)))


def run_child(cfg, request, seed_box, workdir, out_w, err_w, verdict_w, compiled_tests=None):
    """Body of the forked child. Never returns.

    ``compiled_tests``: the server's ``compile_tests`` result for this request's tests
    (compiled once for every program sharing them, never with errors), or None to compile
    them here.
    """
    _exit, _write, _repr, _encode = os._exit, os.write, repr, str.encode
    try:
        _prepare_process(cfg, workdir, out_w, err_w, verdict_w)
    except BaseException:  # noqa: BLE001 - report on stderr, the server classifies the exit
        try:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            _exit(CHILD_SETUP_FAILED)

    def emit(message):
        data = _encode(_repr(message) + "\n", "utf-8", "surrogatepass")
        while data:
            data = data[_write(VERDICT_FD, data) :]

    per_assert = bool(request.get("per_assert"))
    source = request["source"]
    phase = "tests"
    try:
        register_test_lines(request.get("tests"))
        units = compile_tests(request.get("tests"), per_assert) if compiled_tests is None else compiled_tests
        phase = "program"
        linecache.cache["<program>"] = (len(source), None, source.splitlines(True), "<program>")
        program = compile(source, "<program>", "exec")
    except BaseException as err:  # noqa: BLE001 - nothing untrusted has run yet
        name = type(err).__name__
        if isinstance(err, SyntaxError):
            message = f"{err.msg} (line {err.lineno}, column {err.offset})"
        else:
            message = str(err)[:_TEXT_CAP]
        if phase == "tests":
            message = "in tests: " + message
        status = "memory" if isinstance(err, MemoryError) else "error"
        emit(("compile", status, name, message, phase))
        _exit(0)
    # The plan is the first line on the verdict pipe, written before any untrusted code.
    emit(("plan", [(text[:_TEXT_CAP], kind) for text, _, kind, _ in units[:_MAX_OUTCOMES]], len(units)))
    # A copy of builtins: `import builtins; builtins.len = ...` cannot reach the tests.
    namespace = {"__name__": "__sandbox__", "__builtins__": dict(builtins.__dict__)}
    stdout, stderr, consume = sys.stdout, sys.stderr, collections.deque
    install_guard()
    try:  # the iterator is never bound to a name of this frame (see _launch)
        consume(_launch(program, units, _make_runner(per_assert), namespace, seed_box), 0)
    except BaseException:  # noqa: BLE001 - the units that finished have their tokens out
        pass
    for stream in (stdout, stderr):  # the program's buffered output belongs before the end
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a closed or hostile stream
            pass
    _exit(0)
