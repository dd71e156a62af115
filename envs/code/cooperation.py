"""How ``main`` cooperates with ``aux``, decided from the syntax tree (never from text).

Only real call nodes count: ``aux`` mentioned in a comment or inside a string literal is
not a call. The analysis looks at the entry-point function (nested functions and
lambdas inside it included) and answers four questions:

* does main call aux at all (directly, or through a local alias such as ``h = aux``)?
* is some call's result actually used? A bare expression statement ``aux(x)`` throws the
  result away, and so does ``y = aux(x)`` when ``y`` (or a name copied from it, e.g.
  ``z = y``) is never read afterwards;
* is main a *thin wrapper*, i.e. does it only forward its arguments to aux and return
  the result unchanged? ``return aux(x)`` and ``y = aux(x); z = y; return z`` are
  wrappers (simple aliasing chains are followed); ``return aux(x) + 1`` or
  ``return aux(sorted(x))`` are not;
* how many aux calls are ignored (bare expression statements)?

:func:`cooperation_score` maps the report to ``[0, 1]`` (see its docstring).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field


@dataclass
class CooperationReport:
    calls_aux: bool = False  # at least one real call of aux inside main
    uses_result: bool = False  # at least one call's value flows somewhere that reads it
    ignored_calls: int = 0  # calls whose value is discarded (bare statements, dead stores)
    is_wrapper: bool = False  # main only forwards to aux and returns its result unchanged
    num_calls: int = 0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "calls_aux": self.calls_aux,
            "uses_result": self.uses_result,
            "ignored_calls": self.ignored_calls,
            "is_wrapper": self.is_wrapper,
            "num_calls": self.num_calls,
        }


def cooperation_score(report: CooperationReport) -> float:
    """Cooperation level in ``[0, 1]``.

    * 0.0  -- main never calls aux, or every call's result is thrown away;
    * 0.25 -- main is a thin wrapper (aux does all the work, main adds nothing);
    * 0.75 -- main uses aux's result but also makes calls whose result it ignores;
    * 1.0  -- main calls aux, uses its result, and does work of its own.
    """
    if not report.calls_aux or not report.uses_result:
        return 0.0
    if report.is_wrapper:
        return 0.25
    if report.ignored_calls:
        return 0.75
    return 1.0


def _docstring_free_body(body: list[ast.stmt]) -> list[ast.stmt]:
    out = []
    for i, stmt in enumerate(body):
        is_docstring = (
            i == 0
            and isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        )
        if not is_docstring and not isinstance(stmt, ast.Pass):
            out.append(stmt)
    return out


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    return parents


def _simple_targets(assign: ast.AST) -> list[str] | None:
    """Names bound by ``a = b = value`` / ``a: T = value``; None for other target shapes."""
    if isinstance(assign, ast.Assign):
        targets = assign.targets
    elif isinstance(assign, ast.AnnAssign) and assign.value is not None:
        targets = [assign.target]
    elif isinstance(assign, ast.NamedExpr):
        targets = [assign.target]
    else:
        return None
    names = [t.id for t in targets if isinstance(t, ast.Name)]
    if len(names) == len(targets):
        return names
    return None


class _MainAnalysis:
    def __init__(self, func: ast.FunctionDef | ast.AsyncFunctionDef, aux_name: str):
        self.func = func
        self.aux_name = aux_name
        self.parents = _parents(func)
        self.params = {a.arg for a in ast.walk(func.args) if isinstance(a, ast.arg)}
        self.aux_aliases = self._function_aliases()
        # every Name load inside main, grouped by identifier
        self.loads: dict[str, list[ast.Name]] = {}
        for node in ast.walk(func):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                self.loads.setdefault(node.id, []).append(node)

    def _function_aliases(self) -> set[str]:
        """``aux`` plus local names bound to the function itself (``h = aux``)."""
        aliases = {self.aux_name}
        changed = True
        while changed:
            changed = False
            for node in ast.walk(self.func):
                value = getattr(node, "value", None)
                if not isinstance(value, ast.Name):
                    continue
                names = _simple_targets(node)
                if names and value.id in aliases:
                    new = set(names) - aliases
                    if new:
                        aliases |= new
                        changed = True
        return aliases

    def aux_calls(self) -> list[ast.Call]:
        return [
            node
            for node in ast.walk(self.func)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.aux_aliases
        ]

    def value_is_read(self, node: ast.expr, seen: set[str]) -> bool:
        """Whether the value of ``node`` reaches anything that reads it."""
        parent = self.parents.get(node)
        if isinstance(parent, ast.Expr):
            return False  # bare statement: the value is dropped
        names = _simple_targets(parent) if parent is not None and getattr(parent, "value", None) is node else None
        if names is None:
            return True  # returned, passed on, combined, tested, ... : it is read
        if isinstance(parent, ast.NamedExpr) and not isinstance(self.parents.get(parent), ast.Expr):
            return True  # (y := aux(x)) used inside a larger expression
        for name in names:
            if name in seen:
                continue
            seen.add(name)
            for load in self.loads.get(name, []):
                if self.value_is_read(load, seen):
                    return True
        return False

    def _is_forwarding_call(self, node: ast.expr) -> bool:
        """An aux call whose arguments are plain names or constants (no work done)."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            return False
        if node.func.id not in self.aux_aliases:
            return False
        args = list(node.args) + [k.value for k in node.keywords]
        plain = (ast.Name, ast.Constant)
        return all(isinstance(a, plain) or (isinstance(a, ast.Starred) and isinstance(a.value, ast.Name)) for a in args)

    def is_wrapper(self) -> bool:
        """Main's body only forwards to aux and returns the result unchanged."""
        body = _docstring_free_body(self.func.body)
        if not body:
            return False
        carriers: set[str] = set()  # names holding aux's result unchanged
        for stmt in body:
            if isinstance(stmt, ast.Return):
                value = stmt.value
                if value is None:
                    return False
                return self._is_forwarding_call(value) or (isinstance(value, ast.Name) and value.id in carriers)
            names = _simple_targets(stmt)
            value = getattr(stmt, "value", None)
            if names is None or value is None:
                return False  # any other statement is work of main's own
            if self._is_forwarding_call(value) or (
                isinstance(value, ast.Name) and (value.id in carriers or value.id in self.aux_aliases)
            ):
                if not (isinstance(value, ast.Name) and value.id in self.aux_aliases):
                    carriers |= set(names)
                continue
            return False
        return False


def analyse_cooperation(
    main_func: ast.FunctionDef | ast.AsyncFunctionDef | None, aux_name: str = "aux"
) -> CooperationReport:
    """Analyse how the entry-point function ``main_func`` uses ``aux_name``."""
    report = CooperationReport()
    if main_func is None:
        report.notes.append("main was not found, so it cannot call aux")
        return report
    analysis = _MainAnalysis(main_func, aux_name)
    calls = analysis.aux_calls()
    report.num_calls = len(calls)
    report.calls_aux = bool(calls)
    if not calls:
        report.notes.append(f"main never calls {aux_name}() (mentions in comments or strings do not count)")
        return report
    for call in calls:
        if analysis.value_is_read(call, set()):
            report.uses_result = True
        else:
            report.ignored_calls += 1
    if report.ignored_calls:
        report.notes.append(
            f"main ignores the value of {report.ignored_calls} {aux_name}() call(s); use what aux returns"
        )
    report.is_wrapper = analysis.is_wrapper()
    if report.is_wrapper:
        report.notes.append(
            f"main is a thin wrapper that only returns {aux_name}(...); main should do part of the work"
        )
    return report
