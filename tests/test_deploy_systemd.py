"""systemd units for fleets outside Kubernetes: systemd accepts them, their environment files
name real settings and load, and the stop timeouts cover the drain."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SYSTEMD = REPO / "deploy" / "systemd"
UNITS = {"omni-worker": "worker.env.example", "omni-router": "router.env.example"}


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string((SYSTEMD / f"{name}.service").read_text())
    return parser


def env_file(name: str) -> dict[str, str]:
    """KEY=VALUE lines as systemd reads them, for the subset these files may use: a value is
    either bare (no quotes, backslashes or $) or wholly in single quotes (taken literally)."""
    values: dict[str, str] = {}
    for number, line in enumerate((SYSTEMD / name).read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and key == key.strip() and key.isidentifier(), f"{name}:{number}: {line!r}"
        if value.startswith("'") and value.endswith("'") and len(value) >= 2:
            value = value[1:-1]
            assert "'" not in value, f"{name}:{number}: nested single quote"
        else:
            bad = {c for c in value if c in "\"'\\$"}
            assert not bad, f"{name}:{number}: {sorted(bad)} need single quotes around the value"
        values[key] = value
    return values


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not found")
@pytest.mark.parametrize("name", UNITS)
def test_systemd_accepts_the_unit(name: str, tmp_path: Path) -> None:
    """``systemd-analyze verify`` with the paths of this install: unknown keys, bad values and
    missing executables are reported (as warnings on stderr, so any stderr fails the test)."""
    script = str(Path(sys.executable).with_name(name))  # this environment's console script
    text = (SYSTEMD / f"{name}.service").read_text()
    text = text.replace(f"/opt/omni-fleet/bin/{name}", script)
    text = text.replace(f"/etc/omni-fleet/{UNITS[name].removesuffix('.example')}",
                        str(SYSTEMD / UNITS[name]))  # fmt: skip
    path = tmp_path / f"{name}.service"
    path.write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


@pytest.mark.parametrize("name", UNITS)
def test_environment_files_name_settings_fields_and_load(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        from router.settings import RouterSettings
        from worker.settings import WorkerSettings
    except ImportError as err:  # the daemons are being written in parallel
        pytest.skip(f"daemon settings not importable yet ({err})")
    settings = WorkerSettings if name == "omni-worker" else RouterSettings
    values = env_file(UNITS[name])
    for key in values:
        assert key.startswith("OMNI_"), key
        assert key.removeprefix("OMNI_").lower() in settings.model_fields, key
    for key in [k for k in os.environ if k.startswith("OMNI_")]:
        monkeypatch.delenv(key)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    loaded = settings()
    assert loaded.redis_url is not None
    if name == "omni-worker":
        assert (REPO / str(loaded.spec).removeprefix("/opt/omni-fleet/")).is_file()
        stop = int(unit(name)["Service"]["TimeoutStopSec"])
        assert stop > loaded.drain_timeout, "systemd would SIGKILL a draining worker"
    else:
        assert [k.get_secret_value() for k in loaded.api_key] == ["change-me-client-key"]
        assert loaded.processes == 1


def test_worker_unit_does_not_restart_what_a_restart_cannot_fix() -> None:
    try:
        from worker.daemon import EXIT_BAD_SPEC, EXIT_DOES_NOT_FIT
    except ImportError as err:
        pytest.skip(f"worker.daemon not importable yet ({err})")
    service = unit("omni-worker")["Service"]
    prevented = {int(code) for code in service["RestartPreventExitStatus"].split()}
    assert prevented == {EXIT_BAD_SPEC, EXIT_DOES_NOT_FIT}
    # SIGTERM only to the worker itself: it stops its stage processes after draining
    assert (service["KillSignal"], service["KillMode"]) == ("SIGTERM", "mixed")
