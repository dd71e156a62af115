"""Code extraction, definition parsing, assembly and the test harness."""

import textwrap

from code_fakes import FakeSandbox

from envs.code.program import (
    assemble,
    build_test_harness,
    extract_code,
    parse_definitions,
    prompt_context,
    reference_solution,
)
from envs.code.tasks import normalise_record
from sandbox.types import Program


def test_extract_code_prefers_python_fences():
    text = "Here you go:\n```python\ndef aux(x):\n    return x\n```\nand output:\n```text\n3\n```\nBye"
    assert extract_code(text) == "def aux(x):\n    return x"


def test_extract_code_joins_blocks_and_accepts_unterminated_fence():
    text = "```py\nimport math\n```\n```python\ndef f():\n    return math.pi\n"
    assert extract_code(text) == "import math\n\ndef f():\n    return math.pi"


def test_extract_code_without_fences_is_the_text():
    assert extract_code("def f(): return 1") == "def f(): return 1"


def test_parse_keeps_definitions_and_drops_top_level_calls():
    code = textwrap.dedent("""
        import math
        LIMIT = 3

        def aux(x):
            return math.sqrt(x)

        print(aux(4))
        assert aux(4) == 2
    """)
    parsed = parse_definitions(code)
    assert parsed.parses and set(parsed.functions) == {"aux"}
    assert "print(" not in parsed.kept and "assert" not in parsed.kept
    assert "import math" in parsed.kept and "LIMIT = 3" in parsed.kept
    assert parsed.dropped == ["Expr", "Assert"]


def test_parse_drops_named_definitions_and_keeps_decorators():
    code = "import functools\n@functools.lru_cache\ndef aux(n):\n    return n\n\ndef main(n):\n    return aux(n)\n"
    parsed = parse_definitions(code, drop_names=("main",))
    assert set(parsed.functions) == {"aux"} and "main" in parsed.dropped
    assert parsed.kept.startswith("import functools\n\n@functools.lru_cache")


def test_syntax_error_keeps_line_and_column_and_recovers_trailing_prose():
    code = "def aux(x):\n    return x + 1\nThis function adds one to x."
    parsed = parse_definitions(code)
    assert not parsed.parses
    assert parsed.syntax_error.lineno == 3
    assert parsed.recovered and "aux" in parsed.functions


def test_unrecoverable_code_has_no_functions():
    parsed = parse_definitions("def aux(x):\n    return (x +\n")
    assert not parsed.parses and not parsed.functions and parsed.kept == ""


def test_null_bytes_are_a_syntax_error_not_a_crash():
    parsed = parse_definitions("def f():\n    return 1\x00\n")
    assert not parsed.parses


def test_prompt_context_keeps_imports_and_helpers_not_the_stub():
    prompt = textwrap.dedent('''
        import math

        def poly(xs, x):
            return sum(c * x ** i for i, c in enumerate(xs))

        def find_zero(xs):
            """doc"""
    ''')
    ctx = prompt_context(prompt, "find_zero")
    assert "import math" in ctx and "def poly" in ctx and "find_zero" not in ctx


def test_reference_solution_joins_humaneval_body():
    task = {"prompt": 'def f(x):\n    """doc"""\n', "canonical_solution": "    return x + 1\n", "entry_point": "f"}
    ref = reference_solution(task)
    assert "def f(x)" in ref and "return x + 1" in ref
    assert (
        reference_solution({"prompt": "", "canonical_solution": "def f(x):\n    return x\n", "entry_point": "f"})
        == "def f(x):\n    return x\n"
    )
    assert reference_solution({"prompt": "", "canonical_solution": None, "entry_point": "f"}) is None


TASK = normalise_record(
    {
        "task_id": "t/0",
        "prompt": "def f(n):\n    '''double n'''\n",
        "entry_point": "f",
        "test": "METADATA = {}\n\ndef check(candidate):\n    import math\n    assert candidate(2) == 4\n"
        "    for i in range(3):\n        assert candidate(i) == 2 * i\n    assert candidate(5) == 11\n",
    }
)


def _run(source_code: str):
    prelude, tests = build_test_harness(TASK)
    program = assemble(prompt_context(TASK["prompt"], "f"), source_code) + "\n" + prelude
    return FakeSandbox().run([Program(program, tests, per_assert=True)])[0]


def test_harness_runs_each_statement_and_reports_the_actual_value():
    result = _run("def f(n):\n    return 2 * n\n")
    assert [a.passed for a in result.asserts] == [True, True, True, False]
    last = result.asserts[3]
    assert last.error_type == "AssertionError" and "got 10" in last.error_message
    assert TASK["assert_indices"] == [1, 2, 3]


def test_test_locals_do_not_shadow_program_globals():
    # check() locals (here `str`) must not leak into the candidate's globals
    task = normalise_record(
        {
            "prompt": "def g(x):\n    pass\n",
            "entry_point": "g",
            "test": "def check(candidate):\n    str = 'shadow'\n    assert candidate(3) == '3'\n",
        }
    )
    prelude, tests = build_test_harness(task)
    program = "def g(x):\n    return str(x)\n\n" + prelude
    result = FakeSandbox().run([Program(program, tests, per_assert=True)])[0]
    assert all(a.passed for a in result.asserts)


def test_generator_expressions_see_test_locals():
    task = normalise_record(
        {
            "prompt": "def g(s):\n    pass\n",
            "entry_point": "g",
            "test": "def check(candidate):\n    letters = 'abc'\n"
            "    s = ''.join(c for c in letters)\n    assert candidate(s) == 'abc'\n",
        }
    )
    prelude, tests = build_test_harness(task)
    result = FakeSandbox().run([Program("def g(s):\n    return s\n\n" + prelude, tests, per_assert=True)])[0]
    assert all(a.passed for a in result.asserts)


def test_extract_code_reads_leading_code_before_a_stray_closing_fence():
    # the reply starts with code and closes a fence it never opened: the code is what came first
    assert extract_code("def aux(x):\n    return -x\n```") == "def aux(x):\n    return -x"
    prose_after = "def aux(x):\n    return -x\n```\n\nThis helper negates x.\n```python\nprint(aux(1))\n```"
    assert extract_code(prose_after) == "def aux(x):\n    return -x"
    # prose first, then a real block: the block, as before
    assert extract_code("Here it is:\n```python\ndef f():\n    return 1\n```") == "def f():\n    return 1"
