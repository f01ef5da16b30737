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


# -- folder rules: the worker reads as a stack (issue 34) ------------------------------------

FAMILIES = ROOT / "worker" / "models"


def family_of(module: str) -> str | None:
    """``worker.models.qwen3_tts.talker`` -> ``qwen3_tts``; None outside a family's folder."""
    parts = module.split(".")
    if len(parts) > 2 and parts[:2] == ["worker", "models"] and (FAMILIES / parts[2]).is_dir():
        return parts[2]
    return None


def _under(module: str, *folders: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in folders)


# The worker's stack, top to bottom (docs/omni-worker.md, "The worker's stack"):
#   cli -> daemon (assembles the rest) -> registration -> api -> service -> runtime -> models ->
#   stages -> engines -> layers -> contract; settings, gpus and metrics are leaves.
# The API and the service drive the pipeline through contract's ``Pipeline`` protocol: they
# never import the runtime, which the daemon builds and hands them.
TOP = ("worker.cli", "worker.daemon", "worker.registration")
LEAVES = ("worker.settings", "worker.gpus", "worker.metrics")
# a layer -> what it must not import (the layers above it), unless ``BELOW`` allows it
ABOVE = {
    "worker.contract": ("worker",),
    "worker.layers": ("worker",),
    "worker.settings": ("worker",),
    "worker.gpus": ("worker",),
    "worker.metrics": ("worker",),
    "worker.engines": ("worker.stages", "worker.models", "worker.runtime", "worker.api",
                       "worker.service", *TOP, *LEAVES),
    "worker.stages": ("worker.models", "worker.runtime", "worker.api", "worker.service", *TOP,
                      *LEAVES),
    "worker.models": ("worker.runtime", "worker.api", "worker.service", *TOP, *LEAVES),
    "worker.runtime": ("worker.api", "worker.service", *TOP, *LEAVES),
    "worker.service": ("worker.api", "worker.runtime", *TOP),
    "worker.api": ("worker.runtime", *TOP),
    "worker.registration": ("worker.api", "worker.runtime", "worker.daemon", "worker.cli"),
    "worker.daemon": ("worker.cli",),
}  # fmt: skip
BELOW = {
    "worker.contract": ("worker.contract",),
    "worker.layers": ("worker.layers", "worker.contract"),
    "worker.settings": ("worker.settings",),
    "worker.gpus": ("worker.gpus",),
    "worker.metrics": ("worker.metrics", "worker.contract"),
}


def rule_breaks(graph: dict[str, set[str]]) -> list[str]:
    """Every import that points the wrong way:
    - a layer imports one above it (``ABOVE``; ``contract`` and ``layers`` only what is below);
    - a model family imports another family (a shared piece belongs in ``worker.layers``);
    - anything else imports a family but the registry: the API, the runtime and the models'
      shared modules ask the family record (``worker.models.family.Family``)."""
    breaks = []
    for module, deps in sorted(graph.items()):
        layer = next((f for f in ABOVE if _under(module, f)), None)
        for dep in sorted(deps):
            own, theirs = family_of(module), family_of(dep)
            wrong = (
                (own and theirs and own != theirs)
                or (theirs and not own and module != "worker.models.registry")
                or (
                    layer is not None
                    and _under(dep, *ABOVE[layer])
                    and not _under(dep, *BELOW.get(layer, (layer,)))
                )
            )
            if wrong:
                breaks.append(f"{module} -> {dep}")
    return breaks


def test_the_folder_rules_catch_each_wrong_import() -> None:
    wrong = {
        "worker.models.qwen3_asr.modeling": {"worker.models.qwen3_tts.modeling"},
        "worker.api.transcription": {"worker.models.qwen3_asr.processor"},
        "worker.layers.qwen3_decoder": {"worker.stages.base"},
        "worker.layers.streamed_vocoder": {"worker.stages.vocoder"},
        "worker.engines.sglang.engine": {"worker.runtime.process"},
        "worker.engines.base": {"worker.stages.base"},
        "worker.stages.decode": {"worker.models.qwen3_omni.code2wav"},
        "worker.stages.vocoder": {"worker.runtime.coordinator"},
        "worker.contract.pipeline": {"worker.layers.qwen3_decoder"},
        "worker.runtime.coordinator": {"worker.models.qwen3_tts"},
        "worker.models.checkpoint": {"worker.models.qwen3_omni.tiny"},
        "worker.runtime.process": {"worker.service"},
        "worker.models.family": {"worker.runtime.graph"},
        "worker.api.chat": {"worker.runtime.coordinator"},
        "worker.metrics": {"worker.service"},
        "worker.settings": {"worker.contract.pipeline"},
        "worker.registration": {"worker.daemon"},
    }
    allowed = {
        "worker.models.qwen3_tts.talker": {"worker.layers.qwen3_decoder", "worker.stages.base"},
        "worker.api.speech": {"worker.models.registry"},
        "worker.layers.module_weights": {"worker.layers.stage_weights", "planner.components"},
        "worker.engines.sglang.talkers": {"worker.contract.stage_context", "worker.layers.x"},
        "worker.stages.autoregressive": {"worker.engines.base", "worker.contract.sampling"},
        "worker.contract.options": {"worker.contract.sampling", "fleet.records"},
        "worker.models.registry": {"worker.models.qwen3_tts", "worker.models.qwen3_asr"},
        "worker.runtime.host": {"worker.models.registry", "worker.stages.base"},
        "worker.service": {"worker.models.registry", "worker.metrics", "worker.settings"},
        "worker.daemon": {"worker.runtime.coordinator", "worker.api.app", "worker.registration"},
        "worker.cli": {"worker.daemon", "worker.settings"},
        "worker.api.gate": {"worker.service", "worker.settings"},
    }
    found = rule_breaks({**wrong, **allowed})
    assert found == sorted(f"{m} -> {d}" for m, ds in wrong.items() for d in ds)


def test_the_worker_imports_point_down_its_stack() -> None:
    breaks = rule_breaks(project_graph(("worker",)))
    assert not breaks, "imports against the worker's folder rules: " + "; ".join(breaks)
