"""``--help`` of the three commands reads like a well-kept CLI (issue 12, item 6): every flag has
a plain metavar or lower-case choices, a one-line description and its ``OMNI_`` variable, and
nothing in the text is a Python type. The variables named there are the ones read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "omni-plan": ["planner.cli"],
    "omni-plan explain": ["planner.cli", "explain"],
    "omni-worker": ["worker.cli"],
    "omni-router": ["router.cli"],
    "omni-bench": ["bench.omnibench.cli"],
}
PLAIN_METAVAR = re.compile(
    r"^(?:[A-Z][A-Z_]*(?:\.[A-Z_]+=[A-Z_]+)?|\{[a-z0-9_-]+(?:,[a-z0-9_-]+)*\})$"
)
TYPE_WORDS = re.compile(
    r"SecretStr|list\[|dict\[|\bstr\b|\bint\b|\bfloat\b|\bNone\b|Path\(|factory"
)
ENV = re.compile(r"\[env: (OMNI_[A-Z0-9_]+)(?:, a JSON list)?\]$")


def help_text(args: list[str]) -> str:
    env = dict(os.environ, COLUMNS="1000")  # one line per option: the check reads each whole
    env = {k: v for k, v in env.items() if not k.startswith("OMNI_")}
    done = subprocess.run(
        [sys.executable, "-m", *args, "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def options(text: str) -> dict[str, tuple[str | None, str]]:
    """``--flag`` -> (metavar or None, help) for every option of an argparse help text."""
    body = text.split("\noptions:\n", 1)[1]
    found: dict[str, tuple[str | None, str]] = {}
    current: list[str] = []
    for line in body.splitlines():
        if re.match(r"^  -", line):
            current = [line.strip()]
            head, _, rest = current[0].partition("  ")
            flags = [f.strip() for f in head.split(", ")]
            flag, _, metavar = flags[-1].partition(" ")
            if flag.startswith("--no-"):  # --x, --no-x: an on/off flag
                flag = flags[0]
            found[flag] = (metavar or None, rest.strip())
        elif line.startswith("    ") and current:
            meta, helped = found[flag]
            found[flag] = (meta, f"{helped} {line.strip()}".strip())
        elif not line.strip():
            current = []
    found.pop("--help", None)
    return found


@pytest.fixture(scope="module", params=list(COMMANDS))
def command(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param, help_text(COMMANDS[request.param])


def test_every_flag_has_a_plain_metavar_a_description_and_its_variable(command) -> None:
    name, text = command
    usage = text.split("\n\n", 1)[0]
    assert not TYPE_WORDS.search(usage), f"{name}: a type in the usage line: {usage}"
    flags = options(text)
    assert flags, f"{name}: no options found in {text!r}"
    for flag, (metavar, helped) in flags.items():
        where = f"{name} {flag}"
        if metavar is not None:
            assert PLAIN_METAVAR.match(metavar), f"{where}: metavar {metavar!r}"
        env = ENV.search(helped)
        assert env, f"{where}: no [env: OMNI_...] in {helped!r}"
        # omni-bench's own prefix: it runs beside daemons whose OMNI_MODEL, OMNI_URL... differ
        prefix = "OMNI_BENCH_" if name == "omni-bench" else "OMNI_"
        assert env.group(1) == prefix + flag[2:].replace("-", "_").upper() or (
            flag == "--token" and env.group(1) == "OMNI_WORKER_TOKEN"
        ), f"{where}: {env.group(1)}"
        described = re.sub(r"\(default: [^)]*\)|\[env: [^]]*\]", "", helped).strip()
        assert len(described.split()) >= 2, f"{where}: no description in {helped!r}"
        assert not TYPE_WORDS.search(helped), f"{where}: a type in {helped!r}"


def test_choices_are_lower_case_and_accepted() -> None:
    flags = options(help_text(COMMANDS["omni-router"]))
    policy = flags["--policy"][0]
    assert policy == "{cache_aware,load,least_inflight,round_robin,random,hash}"
    assert flags["--log-level"][0] == "{debug,info,warning,error,critical}"
    from router.settings import RouterSettings

    s = RouterSettings(worker=["http://127.0.0.1:9"], policy="least_inflight", log_level="DEBUG")
    assert s.policy.value == "least_inflight" and s.log_level == "debug"


def test_the_variables_in_the_help_are_read(tmp_path: Path, monkeypatch) -> None:
    """One variable per command, through its real entry point's parser."""
    from fleet.cli_help import cli_source
    from router.settings import RouterSettings
    from worker.settings import WorkerSettings

    monkeypatch.setenv("OMNI_MAX_PIPELINED", "3")
    monkeypatch.setenv("OMNI_WORKER", '["http://127.0.0.1:9"]')
    monkeypatch.setenv("OMNI_POLICY", "round_robin")
    s = RouterSettings(_cli_settings_source=cli_source(RouterSettings, "omni-router", []))
    assert (s.max_pipelined, s.worker, s.policy.value) == (3, ["http://127.0.0.1:9"], "round_robin")
    monkeypatch.setenv("OMNI_WORKER_TOKEN", "secret")
    w = WorkerSettings(_cli_settings_source=cli_source(WorkerSettings, "omni-worker", []))
    assert w.token is not None and w.token.get_secret_value() == "secret"
    # a flag wins over its variable
    s = RouterSettings(
        _cli_settings_source=cli_source(RouterSettings, "omni-router", ["--max-pipelined", "5"])
    )
    assert s.max_pipelined == 5

    spec = ROOT / "configs" / "models" / "tiny-omni.yaml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNI_")}
    plan = [sys.executable, "-m", "planner.cli", str(spec), "--json"]
    by_flag = subprocess.run([*plan, "--gpus", "2xH100-80GB"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    by_env = subprocess.run(plan, cwd=ROOT, env=env | {"OMNI_GPUS": "2xH100-80GB"},
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert by_flag.returncode == 0, by_flag.stderr
    assert by_env.returncode == 0, by_env.stderr
    assert '"H100' in by_flag.stdout
    assert by_env.stdout == by_flag.stdout
