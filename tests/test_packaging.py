"""A router-only host installs ``omni-fleet`` with no extras: what it gets runs omni-router, and
none of the worker's or planner's heavy dependencies come along."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_base_install_runs_the_router_without_torch(tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(REPO)],
        check=True,
        timeout=600,
    )
    installed = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], check=True, capture_output=True,
        text=True,
    ).stdout.lower()  # fmt: skip
    for heavy in ("torch", "transformers", "fastapi", "uvicorn", "rich", "pyyaml", "httpx"):
        assert f"\n{heavy}==" not in "\n" + installed, f"{heavy} came with the base install"
    helped = subprocess.run(
        [env_dir / "bin" / "omni-router", "--help"], capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0, helped.stderr
    assert "--port" in helped.stdout
    probe = (
        "import sys, router.cli, router.app, router.http.server; "
        "heavy = {'torch', 'transformers', 'fastapi', 'yaml', 'rich'} & set(sys.modules); "
        "sys.exit(f'imported {heavy}' if heavy else 0)"
    )
    imported = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60)
    assert imported.returncode == 0, imported.stderr or imported.stdout
