"""Next-turn prompts of the built-in CoopCode transition modes ``plain`` and ``level_feedback``.

``plain`` executes nothing: the agent sees its task, its own past code, its teammate's
latest code and an instruction to revise.

``level_feedback`` adds what the reward run found, without running anything again:

* static diagnostics -- whether ``aux`` and the entry point were found, and a syntax
  error's line and column;
* dynamic diagnostics -- the outcomes of the tests chosen by ``sandbox_slice`` (taken from
  the per-assert outcomes of the reward run, which always runs every test); a failing test
  is shown with its exception;
* notes on how main uses aux (not called, result ignored, thin wrapper).

``sandbox_slice``: ``1`` (default) the first test only; ``N > 0`` the first N; ``N < 0`` the
last ``|N|``; ``0``, ``None`` or ``"all"`` every test.
"""

from __future__ import annotations

from typing import Any, Sequence

from envs.code.program import extract_code

SandboxSlice = int | str | None
_SHOWN_MESSAGE_CHARS = 300
SHOWN_CODE_CHARS = 20_000  # characters of one code block shown in a prompt


def validate_sandbox_slice(value: Any) -> SandboxSlice:
    if value is None or (isinstance(value, str) and value.lower() == "all"):
        return None if value is None else "all"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"sandbox_slice must be an int (N > 0 first N tests, N < 0 last |N|, 0 all), None or 'all'; got {value!r}"
        )
    return value


def select_tests(items: Sequence[Any], sandbox_slice: SandboxSlice) -> list[Any]:
    """The tests ``sandbox_slice`` picks from ``items`` (see the module docstring)."""
    items = list(items)
    # the only string validate_sandbox_slice lets through is "all"
    if sandbox_slice is None or isinstance(sandbox_slice, str) or sandbox_slice == 0:
        return items
    if sandbox_slice > 0:
        return items[:sandbox_slice]
    return items[sandbox_slice:]


def _code_block(code: str) -> str:
    # the code as scored (fences and prose around them removed), fenced once: a raw reply
    # already in a fence would otherwise be shown inside a second one
    code = extract_code(code).strip()
    if not code:
        return "(empty)"
    if len(code) > SHOWN_CODE_CHARS:  # keeps multi-turn prompts bounded after runaway outputs
        code = code[:SHOWN_CODE_CHARS] + f"\n# [... {len(code) - SHOWN_CODE_CHARS} more characters cut]"
    return f"```python\n{code}\n```"


def history_section(agent: str, own_history: Sequence[str], teammates: dict[str, str]) -> str:
    parts = []
    for turn, response in enumerate(own_history, start=1):
        parts.append(f"Your code in turn {turn}:\n{_code_block(response)}")
    for other, code in teammates.items():
        parts.append(f"Latest code of your teammate ({other}):\n{_code_block(code)}")
    return "\n\n".join(parts)


def revise_instruction(target: str) -> str:
    return f"Revise your function `{target}` and reply with its complete code only."


def plain_prompt(initial: str, agent: str, own_history: Sequence[str], teammates: dict[str, str], target: str) -> str:
    return "\n\n".join([initial.rstrip(), history_section(agent, own_history, teammates), revise_instruction(target)])


def _short(text: Any) -> str:
    text = "" if text is None else str(text)
    text = " ".join(text.split())
    return text if len(text) <= _SHOWN_MESSAGE_CHARS else text[: _SHOWN_MESSAGE_CHARS - 3] + "..."


def static_lines(details: dict[str, Any], names: dict[str, str]) -> list[str]:
    lines = []
    for agent, found in details.get("found", {}).items():
        name = names.get(agent, agent)
        lines.append(f"- `{name}` ({agent}): {'found' if found else 'NOT found'}")
    for err in details.get("syntax_errors", []):
        where = f" at line {err['line']}, column {err['column']}" if err.get("line") else ""
        lines.append(f"- syntax error in {err['agent']}'s code{where}: {_short(err['message'])}")
    return lines


def test_lines(details: dict[str, Any], sandbox_slice: SandboxSlice) -> list[str]:
    outcomes = details.get("test_outcomes") or []
    if not outcomes:
        why = "the program could not be built" if details.get("sandbox_status") is None else "the program failed"
        return [f"- the tests did not run: {why}"]
    tests = [o for o in outcomes if o["is_assert"]]
    shown = select_tests(tests, sandbox_slice)
    passed = details.get("tests_passed", 0)
    lines = [f"- {len(shown)} of {len(tests)} test(s) shown; {passed} of {len(tests)} passed overall"]
    failed_setup = [o for o in outcomes if not o["is_assert"] and o["ran"] and not o["passed"]]
    for o in failed_setup:
        lines.append(f"- test setup `{_short(o['test'])}` raised {o['error_type']}: {_short(o['error_message'])}")
    for o in shown:
        if o["passed"]:
            lines.append(f"- PASSED: {_short(o['test'])}")
        elif not o["ran"]:
            lines.append(f"- NOT RUN: {_short(o['test'])}")
        else:
            message = _short(o["error_message"])
            lines.append(f"- FAILED: {_short(o['test'])} -> {o['error_type']}{': ' + message if message else ''}")
    error = details.get("sandbox_error") or {}
    if details.get("sandbox_status") in ("timeout", "memory", "killed"):
        lines.append(f"- the program was stopped: {details['sandbox_status']}")
    elif error.get("type") and not any(o["ran"] for o in outcomes):
        lines.append(f"- the program raised {error['type']}: {_short(error.get('message'))}")
    return lines


def cooperation_lines(details: dict[str, Any], aux_name: str) -> list[str]:
    coop = details.get("cooperation")
    if coop is None:
        return []
    lines = []
    if not coop["calls_aux"]:
        lines.append(f"- main does not call `{aux_name}` (a call in a comment or string does not count)")
    elif not coop["uses_result"]:
        lines.append(f"- main calls `{aux_name}` but never uses its return value")
    elif coop["ignored_calls"]:
        lines.append(f"- main ignores the return value of {coop['ignored_calls']} `{aux_name}` call(s)")
    if coop["is_wrapper"]:
        lines.append(f"- main is a thin wrapper that only returns `{aux_name}(...)`; main should do part of the work")
    if not lines:
        lines.append(f"- main calls `{aux_name}` and uses its result")
    return lines


def level_feedback_prompt(
    initial: str,
    agent: str,
    own_history: Sequence[str],
    teammates: dict[str, str],
    target: str,
    details: dict[str, Any],
    names: dict[str, str],
    sandbox_slice: SandboxSlice,
    aux_name: str = "aux",
) -> str:
    sections = [initial.rstrip(), history_section(agent, own_history, teammates)]
    sections.append("Static checks:\n" + "\n".join(static_lines(details, names)))
    sections.append("Tests:\n" + "\n".join(test_lines(details, sandbox_slice)))
    coop = cooperation_lines(details, aux_name)
    if coop:
        sections.append("How main uses aux:\n" + "\n".join(coop))
    sections.append(revise_instruction(target))
    return "\n\n".join(sections)
