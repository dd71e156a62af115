"""The import rules of docs/design.md, checked by reading every module's imports (AST scan).

Every ``import`` and ``from ... import`` counts, wherever it stands (module level, inside a
function, under ``if TYPE_CHECKING:``): a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("comlrl_core", "envs", "learners", "sandbox")

# Which top-level packages each package may import (docs/design.md, "Import rules").
ALLOWED_PACKAGES = {
    "comlrl_core": {"comlrl_core"},
    "sandbox": {"sandbox"},
    "envs": {"envs", "comlrl_core", "sandbox"},
    "learners": {"learners", "comlrl_core"},
}

# Inside comlrl_core: the contracts at the top level, then the machinery in layers.
# A part may import the parts listed for it (and itself); "contracts" are the top-level modules.
CORE_PARTS = {
    "contracts": {"contracts"},
    "config": {"contracts", "config"},
    "remote": {"contracts", "config", "remote"},
    "run": {"contracts", "config", "run"},
    "models": {"contracts", "config", "remote", "run", "models"},
    "episodes": {"contracts", "config", "remote", "run", "models", "episodes"},
    # the `comlrl` command sits on top: it maps any part's errors to exit codes
    "cli": {"contracts", "config", "remote", "run", "models", "episodes", "cli"},
}
CORE_FACADE = "comlrl_core"  # comlrl_core/__init__.py re-exports the public names of every part


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


KNOWN_MODULES = set(package_modules())


def imported_modules(path: pathlib.Path, name: str) -> Iterator[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            submodules = [f"{module}.{alias.name}" for alias in node.names]
            # `from pkg import sub` needs the submodule, not the rest of pkg's __init__ (which
            # may be the importer's own package, half-initialised); other names need pkg itself
            if not all(s in KNOWN_MODULES for s in submodules):
                yield module
            yield from (s for s in submodules if s in KNOWN_MODULES)


def core_part(module: str) -> str:
    """The part of comlrl_core a module belongs to: a subpackage name or "contracts"."""
    parts = module.split(".")
    if len(parts) >= 2 and (ROOT / "comlrl_core" / parts[1]).is_dir():
        return parts[1]
    if module == "comlrl_core.cli":
        return "cli"
    return "contracts"


def internal_edges() -> dict[str, set[str]]:
    """module -> the modules of the four packages it imports."""
    modules = package_modules()
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges[name] = {m for m in imported_modules(path, name) if m in modules and m != name}
    return edges


EDGES = internal_edges()


def test_scan_sees_the_packages() -> None:
    # guard against a scan that silently finds nothing (then every rule would "pass")
    assert "comlrl_core.models.hf_policy" in EDGES
    assert "comlrl_core.policy" in EDGES["comlrl_core.models.hf_policy"]
    assert len(EDGES) > 100


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_import_only_what_the_design_allows(package: str) -> None:
    bad = []
    for module, path in package_modules().items():
        if module.split(".")[0] != package:
            continue
        for imported in imported_modules(path, module):
            top = imported.split(".")[0]
            if top in PACKAGES and top not in ALLOWED_PACKAGES[package]:
                bad.append(f"{module} imports {imported}")
    assert not bad, f"{package} may import only {sorted(ALLOWED_PACKAGES[package])}:\n" + "\n".join(sorted(set(bad)))


def test_comlrl_core_parts_respect_their_layers() -> None:
    bad = []
    for module, deps in EDGES.items():
        if not module.startswith("comlrl_core") or module == CORE_FACADE:
            continue
        part = core_part(module)
        for dep in deps:
            if not dep.startswith("comlrl_core"):
                continue
            if dep == CORE_FACADE:
                bad.append(f"{module} imports the facade comlrl_core (import the defining module instead)")
                continue
            if core_part(dep) not in CORE_PARTS[part]:
                bad.append(f"{module} ({part}) imports {dep} ({core_part(dep)})")
    assert not bad, "\n".join(sorted(bad))


def test_comlrl_core_top_level_holds_only_contracts_and_subpackages() -> None:
    top = sorted(p.name for p in (ROOT / "comlrl_core").iterdir() if p.suffix == ".py")
    assert top == ["__init__.py", "_moved.py", "cli.py", "env_api.py", "policy.py", "registry.py"]


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among ``edges`` (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_find_cycle_finds_a_planted_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circles_between_modules() -> None:
    cycle = find_cycle(EDGES)
    assert cycle is None, f"import circle: {' -> '.join(cycle or [])}"
