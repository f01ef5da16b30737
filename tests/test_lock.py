"""The locked sets agree with what pyproject.toml declares: a dependency changed without
re-locking (``uv lock``) fails here, for the CPU lock (uv.lock) and the GPU hosts' lock
(deploy/gpu/uv.lock) alike."""

from __future__ import annotations

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
