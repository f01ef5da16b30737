"""No import cycles among the project's own modules (ARCHITECTURE.md: dependencies point one
way). Every import counts, also those under ``TYPE_CHECKING`` and inside functions: a cycle that
only a lazy or type-only import hides is still two modules that cannot be read apart."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("router", "fleet", "planner", "worker")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The project modules ``path`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), or a self-import."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def project_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    files = {module_name(p): p for pkg in packages for p in (ROOT / pkg).rglob("*.py")}
    known = set(files)
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        # a module's own package (its __init__) is imported with it: not an edge of a cycle
        graph[name] = imports_of(path, known) - {name, package}
    return graph


def test_the_cycle_finder_sees_a_type_only_cycle(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "x.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from pkg.y import Y\n")  # fmt: skip
    (pkg / "y.py").write_text("def f():\n    from pkg import x\n")
    known = {"pkg.x", "pkg.y"}
    assert imports_of(pkg / "x.py", known) == {"pkg.y"}
    assert imports_of(pkg / "y.py", known) == {"pkg.x"}


@pytest.mark.parametrize("packages", [PACKAGES], ids=["+".join(PACKAGES)])
def test_no_import_cycles(packages: tuple[str, ...]) -> None:
    found = cycles(project_graph(packages))
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)
