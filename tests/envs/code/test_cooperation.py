"""AST cooperation analysis: what counts as main really using aux."""

import ast
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.code.cooperation import analyse_cooperation, cooperation_score


def _report(src: str, name: str = "f"):
    tree = ast.parse(textwrap.dedent(src))
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return analyse_cooperation(func, "aux")


def test_call_in_comment_does_not_count():
    r = _report("""
        def f(x):
            # result = aux(x)
            return x * 2
    """)
    assert not r.calls_aux and cooperation_score(r) == 0.0


def test_call_in_string_and_docstring_does_not_count():
    r = _report('''
        def f(x):
            """Uses aux(x) internally."""
            code = "aux(x)"
            return len(code) + x
    ''')
    assert not r.calls_aux and r.num_calls == 0 and cooperation_score(r) == 0.0


def test_direct_return_is_a_thin_wrapper():
    r = _report("""
        def f(x):
            '''doc'''
            return aux(x)
    """)
    assert r.calls_aux and r.uses_result and r.is_wrapper
    assert cooperation_score(r) == 0.25


def test_aliasing_chain_is_still_a_wrapper():
    r = _report("""
        def f(x):
            y = aux(x)
            z = y
            w = z
            return w
    """)
    assert r.is_wrapper and cooperation_score(r) == 0.25


def test_function_alias_wrapper():
    r = _report("""
        def f(x, k=1):
            helper = aux
            return helper(x, k=k)
    """)
    assert r.calls_aux and r.is_wrapper


def test_bare_call_ignores_the_result():
    r = _report("""
        def f(x):
            aux(x)
            return x + 1
    """)
    assert r.calls_aux and not r.uses_result and r.ignored_calls == 1
    assert cooperation_score(r) == 0.0


def test_dead_store_through_alias_ignores_the_result():
    r = _report("""
        def f(x):
            y = aux(x)
            z = y
            return x
    """)
    assert not r.uses_result and r.ignored_calls == 1 and cooperation_score(r) == 0.0


def test_real_use_scores_full():
    r = _report("""
        def f(xs):
            total = 0
            for x in xs:
                if aux(x):
                    total += x
            return total
    """)
    assert r.calls_aux and r.uses_result and not r.is_wrapper and r.ignored_calls == 0
    assert cooperation_score(r) == 1.0


@pytest.mark.parametrize(
    "body",
    [
        "return aux(x) + 1",
        "return aux(sorted(x))",
        "y = aux(x)\n    return [v * 2 for v in y]",
        "if (y := aux(x)) > 0:\n        return y\n    return 0",
        "return max(aux(x), 0)",
    ],
)
def test_main_doing_work_is_not_a_wrapper(body):
    r = _report(f"def f(x):\n    {body}\n")
    assert r.calls_aux and r.uses_result and not r.is_wrapper
    assert cooperation_score(r) == 1.0


def test_used_plus_ignored_call_is_penalised_not_zeroed():
    r = _report("""
        def f(x):
            aux(x)
            return aux(x) * 3
    """)
    assert r.uses_result and r.ignored_calls == 1
    assert cooperation_score(r) == 0.75


def test_attribute_call_named_aux_is_not_the_helper():
    r = _report("""
        def f(obj):
            return obj.aux(1) + 1
    """)
    assert not r.calls_aux


def test_missing_main():
    r = analyse_cooperation(None)
    assert not r.calls_aux and r.notes


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("aux()#'\" \n=+1xyz")), max_size=60))
def test_text_inside_comments_or_strings_never_counts(junk):
    # whatever the junk says, once it is a comment or a string it is never a call
    src = "def f(x):\n    # " + junk.replace("\n", " ") + "\n    s = " + repr(junk) + "\n    return s\n"
    r = _report(src)
    assert not r.calls_aux
