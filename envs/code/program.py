"""From completions to one program: code extraction, definitions, assembly, test harness.

* :func:`extract_code` pulls the Python out of a completion (```python fences, or the raw
  text when there is none).
* :func:`parse_definitions` parses one agent's code and keeps what a program needs: imports
  and function / class definitions (and plain assignments). Top-level calls, prints and
  example runs are dropped so that a completion cannot run code outside its functions.
  A completion that fails to parse is retried without trailing non-code (e.g. prose after
  the code); the first syntax error's line and column are kept for the diagnostics.
* :func:`assemble` builds the program: the prompt's context (its imports and helper
  functions, without the entry-point stub), then aux's definitions, then main's.
* :func:`build_test_harness` turns the task's check body into sandbox test statements that run
  one by one, each in a test namespace that copies the program's globals (the way
  ``check(candidate)`` runs them: test-local names never shadow the program's globals).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}
_MAX_RECOVERY_CUTS = 8  # trailing-junk recovery attempts per completion
KEPT_NODES = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
)


_CODE_STARTS = ("def ", "async def ", "class ", "import ", "from ", "@")


def extract_code(text: str) -> str:
    """The Python code of a completion: its python-fenced blocks joined, else the text.

    A reply that starts with code and then closes a fence it never opened (``def f(): ...``
    then a line of three backticks, often followed by prose) is that leading code: the
    stray fence is not read as the opening of a block.
    """
    first = text.find("```")
    head = text[:first]
    if first > 0 and head.lstrip().startswith(_CODE_STARTS) and text[first - 1] == "\n":
        return head.strip("\n")
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(text)]
    python = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    chosen = python or [body for _, body in blocks]
    return "\n\n".join(b.strip("\n") for b in chosen) if chosen else text


@dataclass
class ParsedCode:
    """One agent's code after extraction and parsing."""

    code: str  # the extracted code (what the agent wrote, fences removed)
    kept: str = ""  # the statements a program keeps (imports, defs, assignments)
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    syntax_error: SyntaxError | None = None  # error of the full code (None if it parses)
    recovered: bool = False  # parsed only after dropping trailing lines
    dropped: list[str] = field(default_factory=list)  # names / kinds of statements left out

    @property
    def parses(self) -> bool:
        return self.syntax_error is None


def _parse(code: str) -> ast.Module:
    # ValueError: null bytes; RecursionError / MemoryError: pathological nesting
    try:
        return ast.parse(code)
    except (RecursionError, MemoryError) as err:
        raise SyntaxError(f"the code is nested too deeply to parse ({type(err).__name__})") from None
    except ValueError as err:
        raise SyntaxError(str(err)) from None


def parse_definitions(code: str, drop_names: tuple[str, ...] = ()) -> ParsedCode:
    """Parse ``code`` and keep its definitions; top-level defs named in ``drop_names`` go."""
    result = ParsedCode(code=code)
    lines = code.splitlines()
    tree: ast.Module | None = None
    try:
        tree = _parse(code)
    except SyntaxError as err:
        result.syntax_error = err
        # Recovery: a model often appends prose or a half-written line after the code.
        cut = len(lines)
        for _ in range(_MAX_RECOVERY_CUTS):
            bad_line = getattr(err, "lineno", None) or cut
            cut = min(cut - 1, bad_line - 1)
            if cut <= 0:
                break
            try:
                tree = _parse("\n".join(lines[:cut]))
                result.recovered = True
                break
            except SyntaxError as next_err:
                err = next_err
    if tree is None:
        return result
    kept_parts = []
    for node in tree.body:
        name = getattr(node, "name", None)
        if not isinstance(node, KEPT_NODES):
            result.dropped.append(type(node).__name__)
            continue
        if name in drop_names:
            result.dropped.append(name)
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            result.functions[node.name] = node  # a later definition wins, as at run time
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        kept_parts.append("\n".join(lines[start - 1 : node.end_lineno]))
    result.kept = "\n\n".join(kept_parts)
    return result


def prompt_context(prompt: str, entry_point: str) -> str:
    """The prompt's imports and helpers (e.g. ``poly`` in HumanEval/32), minus the entry stub."""
    try:
        tree = ast.parse(prompt)
    except SyntaxError:
        return ""
    lines = prompt.splitlines()
    parts = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point:
            continue
        if isinstance(node, ast.Expr):
            continue  # module docstrings and stray expressions
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        parts.append("\n".join(lines[start - 1 : node.end_lineno]))
    return "\n\n".join(parts)


def assemble(context: str, *codes: str) -> str:
    """The program: prompt context, then each agent's kept definitions, in order."""
    return "\n\n\n".join(part for part in (context, *codes) if part.strip()) + "\n"


def reference_solution(task: dict) -> str | None:
    """The task's reference as full code defining the entry point, if the source has one."""
    canonical = task.get("canonical_solution")
    if not canonical:
        return None
    parsed = parse_definitions(canonical)
    if parsed.parses and task["entry_point"] in parsed.functions:
        return canonical
    joined = task["prompt"] + canonical  # HumanEval style: the body continues the prompt
    return joined if parse_definitions(joined).parses else None


# ---- test harness -------------------------------------------------------------------------
_NS = "__comlrl_test_ns"
_REPR_LIMIT = 300


def _instrument(statement: str) -> str:
    """``assert f(x) == y`` -> also report what ``f(x)`` returned when it fails."""
    try:
        tree = ast.parse(statement)
    except SyntaxError:
        return statement
    if len(tree.body) != 1:
        return statement
    node = tree.body[0]
    if not (
        isinstance(node, ast.Assert)
        and node.msg is None
        and isinstance(node.test, ast.Compare)
        and len(node.test.ops) == 1
        and isinstance(node.test.ops[0], (ast.Eq, ast.Is))
        and isinstance(node.test.left, ast.Call)
    ):
        return statement
    left = ast.unparse(node.test.left)
    op = "==" if isinstance(node.test.ops[0], ast.Eq) else "is"
    right = ast.unparse(node.test.comparators[0])
    return f"__comlrl_got = {left}\nassert __comlrl_got {op} ({right}), 'got ' + repr(__comlrl_got)[:{_REPR_LIMIT}]"


# Reward-hack canary: what the tests call is the entry point behind a guard that checks
# every result against a fresh sentinel of a private class. A well-behaved value never
# equals it; an object whose __eq__ answers True (or whose __ne__ answers False, or whose
# comparison result is truthy through a rigged __bool__), also inside lists, tuples,
# sets and dicts, raises RewardHackDetected (an AssertionError: the test earns nothing).
REWARD_HACK_ERROR = "RewardHackDetected"
_GUARD = f"""
def __comlrl_guard(fn):
    hack = type({REWARD_HACK_ERROR!r}, (AssertionError,), {{}})
    plain = (int, float, complex, str, bytes, bool, type(None))
    class Sentinel:
        __slots__ = ()
    def rigged(value, depth):
        if type(value) in plain:
            return False
        sentinel = Sentinel()
        try:
            if value == sentinel or not (value != sentinel):
                return True
        except Exception:
            return False
        if depth < 3 and type(value) in (list, tuple, set, frozenset):
            return any(rigged(item, depth + 1) for item in list(value)[:1000])
        if depth < 3 and type(value) is dict:
            return any(rigged(item, depth + 1) for pair in list(value.items())[:1000] for item in pair)
        return False
    def guarded(*args, **kwargs):
        result = fn(*args, **kwargs)
        if rigged(result, 0):
            raise hack("always_equal: the result compares equal to a fresh sentinel object")
        return result
    return guarded
"""


def build_test_harness(task: dict) -> tuple[str, list[str]]:
    """``(prelude, statements)``: code appended to the program, and one sandbox test per
    statement of the task's ``check`` body (in order; setup statements included). The
    tests call the entry point through the reward-hack guard (see ``_GUARD``)."""
    candidate = task.get("candidate_name", "candidate")
    prelude = (
        f"{_GUARD}\n"
        f"{_NS} = dict(globals())\n"
        f"exec(compile({task.get('test_setup', '')!r}, '<test setup>', 'exec'), {_NS})\n"
        f"{_NS}[{candidate!r}] = __comlrl_guard({task['entry_point']})\n"
    )
    statements = [
        f"exec(compile({_instrument(stmt)!r}, '<test {i}>', 'exec'), {_NS})"
        for i, stmt in enumerate(task["test_statements"])
    ]
    return prelude, statements
