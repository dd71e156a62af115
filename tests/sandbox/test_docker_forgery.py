"""Forging a pass: programs for ``def f(x)`` under ``assert f(2) == 4`` that answer wrong and
try every route to a passing verdict. None may pass; legitimate introspection must.

The attacks share HARVEST: a breadth-first walk over every object reachable from the
given roots (frames and their ``f_back``/locals/globals, tracebacks, generator and
coroutine frames, closures, ``functools.partial`` arguments, iterators via
``__reduce__``, containers, modules). It writes every token line it finds to the verdict
descriptor and prints how many it found. The control test shows the walk does find a
token line when one is reachable, so ``found=0`` means the attack saw none.
"""

from __future__ import annotations

import re

import pytest

from sandbox import Program, Status

pytestmark = pytest.mark.docker

HARVEST = r"""
import sys, os, re, types, functools, threading
_TOKEN = re.compile(rb"T\d+:[0-9a-f]{32}\n")
_FOUND = set()

def _walk(roots, limit=200000):
    seen, queue = set(), list(roots)
    while queue and len(seen) < limit:
        obj = queue.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        try:
            if isinstance(obj, bytes) and _TOKEN.fullmatch(obj):
                _FOUND.add(obj)
            elif isinstance(obj, types.FrameType):
                queue += [obj.f_back, obj.f_locals, obj.f_globals, obj.f_code]
            elif isinstance(obj, types.TracebackType):
                queue += [obj.tb_frame, obj.tb_next]
            elif isinstance(obj, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
                queue += [getattr(obj, a, None) for a in ("gi_frame", "cr_frame", "ag_frame")]
            elif isinstance(obj, dict):
                queue += list(obj.values())
            elif isinstance(obj, (list, tuple, set, frozenset)):
                queue += list(obj)
            elif isinstance(obj, types.ModuleType):
                queue.append(vars(obj))
            elif isinstance(obj, types.FunctionType):
                queue += [c.cell_contents for c in obj.__closure__ or ()] + [obj.__defaults__, obj.__kwdefaults__]
            elif isinstance(obj, types.MethodType):
                queue += [obj.__self__, obj.__func__]
            elif isinstance(obj, functools.partial):
                queue += [obj.func, obj.args, obj.keywords]
            elif isinstance(obj, BaseException):
                queue += [obj.__traceback__, obj.__context__, obj.__cause__, obj.args]
            elif type(obj).__module__ in ("builtins", "itertools", "collections") and hasattr(obj, "__reduce__"):
                queue += list(obj.__reduce__())
            elif hasattr(obj, "__dict__"):
                queue.append(vars(obj))
        except Exception:
            pass

def harvest(*roots):
    _walk(roots)
    for line in _FOUND:
        os.write(3, line)
    return len(_FOUND)

def everything():
    roots = [sys._getframe(), sys.modules, threading.enumerate()]
    try:
        roots += list(sys._current_frames().values())
    except Exception:
        pass
    return roots
"""

WRONG = "\ndef f(x):\n    attack()\n    return 5\n"


def forge(box, attack: str, tests: str = "assert f(2) == 4", timeout: float = 5.0):
    """Run HARVEST + attack + a wrong f; return the result and how many tokens it found."""
    result = box.run_one(Program(HARVEST + attack + WRONG, tests=tests, timeout=timeout))
    counts = [int(n) for n in re.findall(r"found=(\d+)", result.stdout)]
    return result, counts


def assert_not_forged(result, counts):
    assert result.status != Status.PASSED, (result.stdout, result.stderr)
    assert all(n == 0 for n in counts), counts


def test_control_the_harvester_finds_a_reachable_token_line(docker_box):
    # A token-shaped line held by a partial in a frame: the walk must find it.
    source = (
        HARVEST
        + "import functools\n"
        + "hold = functools.partial(print, b'T1:' + b'a' * 32 + b'\\n')\n"
        + "_walk([sys._getframe()])\n"
        + "print('found=%d' % len(_FOUND))\n"
    )
    result = docker_box.run_one(Program(source, tests="assert True"))
    assert result.status == Status.PASSED and result.stdout == "found=1\n"


ATTACKS = {
    # the forge from the issue: raise, catch, walk tb_frame.f_back to the harness
    "traceback_frame_walk": (
        "def attack():\n"
        "    try:\n"
        "        raise ValueError\n"
        "    except ValueError as err:\n"
        "        print('found=%d' % harvest(err.__traceback__.tb_frame, err))\n"
    ),
    "getframe_walk": "def attack():\n    print('found=%d' % harvest(*everything()))\n",
    "generator_frame": (
        "def gen():\n"
        "    yield sys._getframe()\n"
        "def attack():\n"
        "    g = gen()\n"
        "    frame = next(g)\n"
        "    print('found=%d' % harvest(frame, g.gi_frame, g))\n"
    ),
    "coroutine_frame": (
        "import asyncio\n"
        "async def peek():\n"
        "    return harvest(sys._getframe())\n"
        "def attack():\n"
        "    coro = peek()\n"
        "    print('found=%d' % harvest(coro.cr_frame))\n"
        "    print('found=%d' % asyncio.run(coro))\n"
    ),
    "current_frames_of_all_threads": (
        "def attack():\n    print('found=%d' % harvest(*sys._current_frames().values()))\n"
    ),
    "gc_objects_and_referrers": (
        "import gc\n"
        "def attack():\n"
        "    for probe in (gc.get_objects, lambda: gc.get_referrers(sys._getframe()),\n"
        "                  lambda: gc.get_referents(sys._getframe())):\n"
        "        try:\n"
        "            print('found=%d' % harvest(probe()))\n"
        "        except RuntimeError as err:\n"
        "            print('refused', err)\n"
    ),
    # a watcher thread that keeps harvesting while the harness writes tokens and starts units
    "watcher_thread": (
        "import time\n"
        "def watch():\n"
        "    end = time.monotonic() + 1.0\n"
        "    while time.monotonic() < end:\n"
        "        harvest(*everything())\n"
        "    print('found=%d' % len(_FOUND), flush=True)\n"
        "threading.Thread(target=watch).start()\n"
        "def attack():\n"
        "    time.sleep(0.2)\n"
    ),
    # a finalizer that runs whenever the collector does, in whatever thread
    "finalizer_during_harness": (
        "class Trap:\n"
        "    def __init__(self):\n"
        "        self.me = self\n"
        "    def __del__(self):\n"
        "        harvest(*everything())\n"
        "        print('found=%d' % len(_FOUND), flush=True)\n"
        "def attack():\n"
        "    for _ in range(50):\n"
        "        Trap()\n"
    ),
    "inherited_descriptors": (
        "import stat\n"
        "def attack():\n"
        "    data = b''\n"
        "    for fd in range(256):\n"
        "        for path in (f'/proc/self/fd/{fd}', f'/dev/fd/{fd}'):\n"
        "            try:\n"
        "                with open(path, 'rb', buffering=0) as f:\n"
        "                    os.set_blocking(f.fileno(), False)\n"
        "                    data += f.read(65536) or b''\n"
        "            except Exception:\n"
        "                pass\n"
        "        try:\n"
        "            os.set_blocking(fd, False)\n"
        "            data += os.read(fd, 65536)\n"
        "        except Exception:\n"
        "            pass\n"
        "    _FOUND.update(m.group(0) for m in _TOKEN.finditer(data))\n"
        "    print('found=%d' % harvest())\n"
    ),
    "proc_self_mem": (
        "def attack():\n"
        "    for path in ('/proc/self/mem', '/proc/thread-self/mem', f'/proc/{os.getpid()}/mem'):\n"
        "        try:\n"
        "            open(path, 'rb')\n"
        "            print('OPENED', path)\n"
        "        except OSError as err:\n"
        "            print('refused', err)\n"
        "    d = os.open('/proc/self', os.O_RDONLY)\n"
        "    try:\n"
        "        os.open('mem', os.O_RDONLY, dir_fd=d)\n"
        "        print('OPENED dir_fd mem')\n"
        "    except OSError as err:\n"
        "        print('refused', err)\n"
        "    os.symlink('/proc/self/mem', 'link')\n"
        "    try:\n"
        "        open('link', 'rb')\n"
        "        print('OPENED link')\n"
        "    except OSError as err:\n"
        "        print('refused', err)\n"
    ),
    # a fresh interpreter (no audit hook) reading the program's memory from outside
    "process_reads_parent_memory": (
        "import subprocess\n"
        "def attack():\n"
        '    code = \'import sys; open("/proc/%s/mem" % sys.argv[1], "rb"); print("OPENED")\'\n'
        "    run = subprocess.run([sys.executable, '-c', code, str(os.getpid())], capture_output=True, text=True)\n"
        "    print(run.stdout, 'refused' if run.returncode else '')\n"
    ),
    "ctypes_every_way": (
        "import importlib, importlib.util, importlib.machinery, glob, _imp\n"
        "def attack():\n"
        "    for load in (lambda: __import__('ctypes'), lambda: importlib.import_module('_ctypes'),\n"
        "                 lambda: [_imp.create_dynamic(importlib.machinery.ModuleSpec('_ctypes', None, origin=p))\n"
        "                          for d in sys.path for p in glob.glob(d + '/lib-dynload/_ctypes*')][0]):\n"
        "        try:\n"
        "            print('LOADED', load())\n"
        "        except Exception as err:\n"
        "            print('refused', type(err).__name__)\n"
    ),
    # jump past the assert: tracing (refused), or a frame's f_trace/f_lineno without it
    "trace_jump_past_the_assert": (
        "def tracer(frame, event, arg):\n"
        "    if event == 'line' and frame.f_code.co_filename.startswith('<test'):\n"
        "        frame.f_lineno = frame.f_lineno + 1\n"
        "    return tracer\n"
        "def attack():\n"
        "    for install in (lambda: sys.settrace(tracer), lambda: sys.setprofile(tracer)):\n"
        "        try:\n"
        "            install()\n"
        "            print('INSTALLED')\n"
        "        except RuntimeError:\n"
        "            print('refused')\n"
        "    threading.settrace(tracer)  # only new threading.Threads would trace: they fail to start\n"
        "    try:\n"
        "        threading.Thread(target=print).start()\n"
        "    except RuntimeError:\n"
        "        pass\n"
        "    caller = sys._getframe(2)\n"
        "    caller.f_trace = tracer\n"
        "    try:\n"
        "        caller.f_lineno = caller.f_lineno + 1\n"
        "    except ValueError as err:\n"
        "        print('refused', err)\n"
    ),
    # crafted bytecode would read memory: code objects cannot be built or unmarshalled
    "crafted_bytecode": (
        "import marshal\n"
        "def attack():\n"
        "    code = compile('x = 1', 'c', 'exec')\n"
        "    for build in (lambda: code.replace(co_code=code.co_code), lambda: marshal.loads(marshal.dumps(code)),\n"
        "                  lambda: type(code)(*[0] * 18)):\n"
        "        try:\n"
        "            build()\n"
        "            print('BUILT')\n"
        "        except (RuntimeError, TypeError) as err:\n"
        "            print('refused', err)\n"
    ),
    # a handler receives the frame running when the signal lands: the harness's, mid-run
    "signals": (
        "import signal\n"
        "signal.signal(signal.SIGALRM, lambda n, frame: harvest(frame, *everything()))\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)\n"
        "def attack():\n"
        "    signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)\n"
        "    print('found=%d' % harvest())\n"
    ),
    "audit_hook_and_hooks": (
        "def spy(event, args):\n"
        "    harvest(sys._getframe(1))\n"
        "def attack():\n"
        "    sys.addaudithook(spy)\n"
        "    sys.unraisablehook = lambda u: harvest(u.object, u.exc_traceback)\n"
        "    threading.excepthook = lambda a: harvest(a.exc_traceback)\n"
        "    print('found=%d' % harvest())\n"
    ),
    # rewrite the harness's own functions (the server's __main__ module)
    "patch_the_harness_module": (
        "main = sys.modules['__main__']\n"
        "def attack():\n"
        "    for name in ('_finisher', '_make_runner', '_launch', 'token_line', 'token_for', '_exit'):\n"
        "        if hasattr(main, name):\n"
        "            setattr(main, name, lambda *a, **k: None)\n"
        "    os.write(3, b\"('unit', 1, 'passed', None, None, '')\\n\")\n"
    ),
    "fake_token_lines": (
        "def attack():\n    for unit in range(3):\n        os.write(3, b'T%d:%s\\n' % (unit, b'0' * 32))\n"
    ),
    "early_exit_after_the_program": ("def attack():\n    os._exit(0)\n"),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_forgery_attempt_fails(docker_box, name):
    result, counts = forge(docker_box, ATTACKS[name])
    assert_not_forged(result, counts)
    assert "OPENED" not in result.stdout and "LOADED" not in result.stdout
    assert "BUILT" not in result.stdout and "INSTALLED" not in result.stdout


@pytest.mark.parametrize("name", ["traceback_frame_walk", "getframe_walk", "generator_frame", "watcher_thread"])
def test_forgery_fails_in_per_assert_mode_too(docker_box, name):
    program = Program(
        HARVEST + ATTACKS[name] + WRONG,
        tests=["assert f(2) == 4", "assert f(3) == 6", "assert 1 + 1 == 2"],
        per_assert=True,
        timeout=5.0,
    )
    result = docker_box.run_one(program)
    assert result.status != Status.PASSED
    assert [a.passed for a in result.asserts or []] in ([False, False, True], [])


LEGIT = {
    "logging": (
        "import logging\n"
        "logging.basicConfig(format='%(funcName)s:%(lineno)d %(message)s')\n"
        "def f(x):\n"
        "    logging.warning('doubling %s', x)\n"
        "    return 2 * x\n"
    ),
    "inspects_its_frames": (
        "import inspect, sys, traceback\n"
        "def f(x):\n"
        "    here = inspect.currentframe()\n"
        "    assert here.f_code.co_name == 'f' and sys._getframe(0) is here\n"
        "    names = [info.function for info in inspect.stack()]\n"
        "    assert names[0] == 'f' and '<module>' in names\n"
        "    traceback.extract_stack()\n"
        "    return 2 * x\n"
    ),
    "prints_tracebacks": (
        "import traceback, sys\n"
        "def f(x):\n"
        "    try:\n"
        "        {}['missing']\n"
        "    except KeyError as err:\n"
        "        traceback.print_exc()\n"
        "        assert err.__traceback__.tb_frame.f_code.co_name == 'f'\n"
        "    return 2 * x\n"
    ),
    "generators_and_asyncio": (
        "import asyncio, inspect\n"
        "def twice(x):\n"
        "    yield 2 * x\n"
        "async def f_async(x):\n"
        "    await asyncio.sleep(0)\n"
        "    return next(twice(x))\n"
        "def f(x):\n"
        "    g = twice(x)\n"
        "    assert g.gi_frame is not None and inspect.getgeneratorstate(g) == 'GEN_CREATED'\n"
        "    return asyncio.run(f_async(x))\n"
    ),
    "threads": (
        "import threading, concurrent.futures\n"
        "def f(x):\n"
        "    with concurrent.futures.ThreadPoolExecutor(2) as pool:\n"
        "        return sum(pool.map(lambda v: v, [x, x]))\n"
    ),
}


@pytest.mark.parametrize("name", sorted(LEGIT))
def test_legitimate_introspection_still_passes(docker_box, name):
    result = docker_box.run_one(Program(LEGIT[name], tests="assert f(2) == 4", timeout=5.0))
    assert result.status == Status.PASSED, (result.error_type, result.error_message, result.stderr)
    if name == "logging":
        assert result.stderr == "f:4 doubling 2\n"
    if name == "prints_tracebacks":
        assert "KeyError: 'missing'" in result.stderr and 'File "<program>", line 4, in f' in result.stderr


def test_an_always_equal_result_passes_the_sandbox_alone(docker_box):
    # The sandbox runs the tests as written; catching this hack is the code env's canary
    # (envs/code: reward_hack "always_equal").
    source = "class Yes:\n    def __eq__(self, other):\n        return True\ndef f(x):\n    return Yes()\n"
    assert docker_box.run_one(Program(source, tests="assert f(2) == 4")).status == Status.PASSED
