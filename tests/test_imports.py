"""Every module of the product imports in this environment, SGLang's engine modules through the
vendor layer included: a package that the lock does not install fails here in seconds, with its
name, rather than in a worker's start-up log; and every package the product imports is one that
pyproject.toml declares, not one that happens to come with another."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("fleet", "planner", "router", "worker", "bench.omnibench")

# A stage process's order: the vendor layer first (worker.engines.sglang.load applies the
# patches around SGLang's first import), then every module; each failure is reported, not only
# the first.
_PROBE = """
import importlib, pkgutil, sys, traceback
from worker.engines import sglang
sglang.load()
failed = []
for package in sys.argv[1:]:
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        try:
            importlib.import_module(info.name)
        except BaseException as exc:
            failed.append(f"{info.name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_every_module_imports() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *PACKAGES],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    failed = f"{done.stdout}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"modules that do not import:\n{failed}"


def test_the_probe_reports_a_missing_package(tmp_path: Path) -> None:
    """The probe above fails, naming the module and the package, when an import is missing."""
    package = tmp_path / "probe_target"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "needs_it.py").write_text("import a_package_nobody_installed\n")
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, "probe_target"],
        cwd=REPO,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 1
    assert "probe_target.needs_it: ModuleNotFoundError" in done.stdout
    assert "a_package_nobody_installed" in done.stdout


def _declared() -> set[str]:
    """The distributions pyproject.toml names, in the base set or any extra (normalized)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"].values()
    wanted = [*project["dependencies"], *(d for extra in extras for d in extra)]
    return {re.split(r"[\s<>=!~;@\[]", d, maxsplit=1)[0].lower().replace("_", "-") for d in wanted}


def test_every_imported_package_is_declared() -> None:
    """A module imported by name (``import x`` / ``from x import``, lazily or not) comes from a
    distribution that pyproject.toml declares: one that only another package brings today may
    go with that package's next release."""
    declared, providers = _declared(), packages_distributions()
    ours = {p.split(".")[0] for p in PACKAGES}
    undeclared: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package.replace(".", "/")).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for top in {name.split(".")[0] for name in names}:
                    if top in sys.stdlib_module_names or top in ours:
                        continue
                    dists = {d.lower().replace("_", "-") for d in providers.get(top, [])}
                    if not dists & declared:
                        undeclared.setdefault(top, []).append(str(path.relative_to(REPO)))
    assert not undeclared, f"imported, not declared in pyproject.toml: {undeclared}"
