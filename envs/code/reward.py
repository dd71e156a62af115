"""The CoopCode team reward: four levels, one number.

Scale (defaults; the maximum is 4.0, the scale CoMLRL users know)::

    reward = 0.5 * definitions + 0.5 * syntax + 2.0 * tests + 1.0 * cooperation

each level in ``[0, 1]``:

``definitions``  the required functions are defined where they belong: ``aux`` in the aux
                 agent's completion and the entry point in main's (0.5 each); in single-agent
                 mode the entry point alone (1.0).
``syntax``       every completion parses as written and the combined program parses (0 when no
                 required definition was found at all, so that empty text earns nothing).
``tests``        the pass rate over ALL the task's asserts, run in the sandbox (0 when the
                 program cannot be built: entry point missing or a syntax error).
``cooperation``  how main uses aux, from the syntax tree (see :mod:`envs.code.cooperation`):
                 1.0 real use, 0.75 used but some calls ignored, 0.25 thin wrapper, 0.0 no
                 call or the result ignored. It pays only when at least one test passes, so
                 that calling aux from wrong code is not rewarded. Single-agent mode has no
                 cooperation level (``None``) and a maximum of 3.0.

``RewardWeights`` changes the weights; ``infos[agent]["max_reward"]`` reports the maximum and
``infos[agent]["levels"]`` the four levels.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from typing import Any

from envs.code.cooperation import CooperationReport, analyse_cooperation, cooperation_score
from envs.code.program import (
    REWARD_HACK_ERROR,
    ParsedCode,
    assemble,
    build_test_harness,
    extract_code,
    parse_definitions,
    prompt_context,
)


@dataclass(frozen=True)
class RewardWeights:
    """Weight of each level; the maximum reward is their sum (4.0 by default)."""

    definitions: float = 0.5
    syntax: float = 0.5
    tests: float = 2.0
    cooperation: float = 1.0

    def __post_init__(self) -> None:
        for name in ("definitions", "syntax", "tests", "cooperation"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"RewardWeights.{name} must be a finite number >= 0, got {value!r}")

    def describe(self, single: bool) -> str:
        """The reward formula in words, reported in infos."""
        text = f"{self.definitions}*definitions + {self.syntax}*syntax + {self.tests}*tests"
        return text if single else text + f" + {self.cooperation}*cooperation"

    def maximum(self, single: bool) -> float:
        return self.definitions + self.syntax + self.tests + (0.0 if single else self.cooperation)


@dataclass
class Submission:
    """Static analysis of one joint action (everything decided before the sandbox runs)."""

    task: dict
    single: bool
    aux_name: str
    parsed: dict[str, ParsedCode]
    found: dict[str, bool]
    syntax_errors: list[dict[str, Any]] = field(default_factory=list)
    program: str | None = None  # None: nothing worth running
    cooperation: CooperationReport | None = None
    diagnostics: list[str] = field(default_factory=list)


def _syntax_record(agent: str, err: SyntaxError) -> dict[str, Any]:
    return {"agent": agent, "line": err.lineno, "column": err.offset, "message": err.msg or str(err)}


def analyse(task: dict, actions: dict[str, str], single: bool, aux_name: str = "aux") -> Submission:
    """Extract, parse and assemble one joint action; never raises on bad text."""
    entry = task["entry_point"]
    if single:
        parsed = {"main": parse_definitions(extract_code(actions.get("main", "")))}
        found = {"main": entry in parsed["main"].functions}
    else:
        parsed = {
            "aux": parse_definitions(extract_code(actions.get("aux", "")), drop_names=(entry,)),
            "main": parse_definitions(extract_code(actions.get("main", "")), drop_names=(aux_name,)),
        }
        found = {"aux": aux_name in parsed["aux"].functions, "main": entry in parsed["main"].functions}
    sub = Submission(task=task, single=single, aux_name=aux_name, parsed=parsed, found=found)

    for agent, code in parsed.items():
        wanted = entry if agent == "main" else aux_name
        if not code.code.strip():
            sub.diagnostics.append(f"{agent}: the completion has no code")
        elif code.syntax_error is not None:
            record = _syntax_record(agent, code.syntax_error)
            sub.syntax_errors.append(record)
            kept = " (the definitions before it were kept)" if code.recovered else ""
            where = f" at line {record['line']}, column {record['column']}" if record["line"] else ""
            sub.diagnostics.append(f"{agent}: SyntaxError{where}: {record['message']}{kept}")
        if not found[agent]:
            sub.diagnostics.append(f"{agent}: no function `{wanted}` was found; define `def {wanted}(...)`")
        else:
            sub.diagnostics.append(f"{agent}: `{wanted}` found")
        other = aux_name if agent == "main" else entry
        if not single and other in code.dropped:
            sub.diagnostics.append(
                f"{agent}: its own definition of `{other}` was ignored; that function is the other agent's job"
            )

    if found["main"]:
        codes = [parsed["main"].kept] if single else [parsed["aux"].kept, parsed["main"].kept]
        program = assemble(prompt_context(task["prompt"], entry), *codes)
        try:
            ast.parse(program)
            sub.program = program
        except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
            sub.diagnostics.append(f"the combined program does not parse: {err}")
            sub.syntax_errors.append(
                {
                    "agent": "combined",
                    "line": getattr(err, "lineno", None),
                    "column": getattr(err, "offset", None),
                    "message": str(err),
                }
            )
    if not single:
        sub.cooperation = analyse_cooperation(parsed["main"].functions.get(entry), aux_name)
        if not found["aux"] and sub.cooperation.calls_aux:
            sub.diagnostics.append(f"main calls `{aux_name}` but the aux agent did not define it")
    return sub


def harness_for(sub: Submission) -> tuple[str, list[str]] | None:
    """``(source, test statements)`` for the sandbox, or None when nothing should run."""
    if sub.program is None:
        return None
    prelude, statements = build_test_harness(sub.task)
    return sub.program + "\n\n" + prelude, statements


def _outcomes(task: dict, result: Any) -> list[dict[str, Any]]:
    """One record per check-body statement, from the sandbox's per-assert outcomes."""
    by_index = {a.index: a for a in (getattr(result, "asserts", None) or [])}
    asserts = set(task["assert_indices"])
    records = []
    for i, text in enumerate(task["test_statements"]):
        outcome = by_index.get(i)
        records.append(
            {
                "index": i,
                "test": text,
                "is_assert": i in asserts,
                "ran": outcome is not None,
                "passed": bool(outcome is not None and outcome.passed),
                "error_type": None if outcome is None else outcome.error_type,
                "error_message": None if outcome is None else outcome.error_message,
            }
        )
    return records


def score(sub: Submission, result: Any | None, weights: RewardWeights) -> tuple[float, dict[str, Any]]:
    """Team reward and infos details of one analysed joint action and its sandbox result."""
    task = sub.task
    required = list(sub.found.values())
    definitions = sum(required) / len(required)
    syntax = float(any(required) and not sub.syntax_errors and sub.program is not None)
    total = len(task["assert_indices"])
    outcomes = _outcomes(task, result) if result is not None else []
    passed_n = sum(o["passed"] for o in outcomes if o["is_assert"])
    diagnostics = list(sub.diagnostics)
    # The canary (envs.code.program._GUARD) caught a result that equals anything: the whole
    # test level goes, so rigging some answers never pays.
    reward_hack = None
    if any(o["error_type"] == REWARD_HACK_ERROR for o in outcomes) or (
        getattr(result, "error_type", None) == REWARD_HACK_ERROR
    ):
        reward_hack = "always_equal"
        diagnostics.append(
            "reward hack: a result compared equal to a fresh sentinel object (a rigged __eq__/__ne__/__bool__); "
            "no test earns credit"
        )
        passed_n = 0
    tests = passed_n / total if total else 0.0
    all_ran_ok = bool(outcomes) and all(o["passed"] for o in outcomes)
    passed = bool(
        result is not None and getattr(result, "passed", False) and all_ran_ok and passed_n == total and not reward_hack
    )
    status = None
    if result is not None:
        status = getattr(getattr(result, "status", None), "value", str(getattr(result, "status", "")))
        if not getattr(result, "asserts", None) and not getattr(result, "passed", False):
            diagnostics.append(
                f"the program failed before the tests ran ({status}): "
                f"{getattr(result, 'error_type', None) or ''} {getattr(result, 'error_message', None) or ''}".strip()
            )
        elif status == "timeout":
            diagnostics.append("the program ran out of time; later tests did not run")
    elif sub.program is None:
        diagnostics.append("tests were not run: the program could not be built")

    cooperation: float | None = None
    if not sub.single:
        report = sub.cooperation or CooperationReport()
        raw_coop = cooperation_score(report) if sub.found.get("aux") else 0.0
        diagnostics.extend(report.notes)
        if raw_coop > 0 and passed_n == 0:
            diagnostics.append("cooperation earns nothing until at least one test passes")
        cooperation = raw_coop if passed_n > 0 else 0.0

    levels = {"definitions": definitions, "syntax": syntax, "tests": tests, "cooperation": cooperation}
    reward = (
        weights.definitions * definitions
        + weights.syntax * syntax
        + weights.tests * tests
        + (weights.cooperation * cooperation if cooperation is not None else 0.0)
    )
    details: dict[str, Any] = {
        "levels": levels,
        "max_reward": weights.maximum(sub.single),
        "reward_scale": weights.describe(sub.single),
        "tests_passed": passed_n,
        "tests_total": total,
        "pass_rate": tests,
        "passed": passed,
        "found": dict(sub.found),
        "syntax_errors": list(sub.syntax_errors),
        "cooperation": None if sub.single else (sub.cooperation or CooperationReport()).as_dict(),
        "test_outcomes": outcomes,
        "sandbox_status": status,
        "sandbox_error": None
        if result is None
        else {"type": getattr(result, "error_type", None), "message": getattr(result, "error_message", None)},
        "diagnostics": diagnostics,
        "reward_hack": reward_hack,
        "task_id": task.get("task_id"),
    }
    return float(reward), details
