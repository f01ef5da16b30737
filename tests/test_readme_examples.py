"""The curl examples of README.md and docs/quickstart.md, run against the live fleet.

Rule (docs/reliability.md): every ``curl`` command inside a fenced ```bash / ```sh / ```shell /
```console block of those files is run, continuation lines included, unless the block is
preceded by a ``<!-- not-tested: reason -->`` line. The router address in the examples
(``localhost`` or ``127.0.0.1`` on port 8000 or 8080, with or without ``http://``, or
``$OMNI_URL``) is pointed at the fleet's router; the fleet requires an API key, so each curl
also carries one (as a client configured with ``OMNI_API_KEY`` would). A command passes when
it exits 0 with ``--fail`` semantics (no HTTP error status) from a scratch directory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.reliability.fleet import Fleet

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "docs" / "quickstart.md"]
_FENCE = re.compile(r"^```(bash|sh|shell|console)\s*$")
# the router address of the examples: port 8000 (omni-router --local-workers) or 8080 (default)
_ADDRESS = re.compile(r"(?:https?://)?(?:localhost|127\.0\.0\.1):(?:8000|8080)")


def curl_commands(path: Path) -> list[tuple[str, str]]:
    """(id, command) for every tested curl command of one Markdown file."""
    if not path.exists():
        return []
    out = []
    lines = path.read_text().splitlines()
    i = 0
    skip_next = False
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("<!-- not-tested"):
            skip_next = True
        elif _FENCE.match(line.strip()):
            block_start = i + 1
            j = block_start
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            if not skip_next:
                block = lines[block_start:j]
                k = 0
                while k < len(block):
                    text = block[k].strip().removeprefix("$ ")
                    if text.startswith("curl "):
                        parts = [text]
                        while parts[-1].endswith("\\") and k + 1 < len(block):
                            k += 1
                            parts.append(block[k].strip())
                        out.append((f"{path.name}:{block_start + k + 1}", "\n".join(parts)))
                    k += 1
            skip_next = False
            i = j
        elif line.strip():
            skip_next = skip_next and line.strip().startswith("<!--")
        i += 1
    return out


COMMANDS = [c for doc in DOCS for c in curl_commands(doc)]


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first test on the live fleet waits for it to start
@pytest.mark.skipif(not COMMANDS, reason="no curl examples in README.md or docs/quickstart.md yet")
@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("command", [c for _, c in COMMANDS], ids=[i for i, _ in COMMANDS])
def test_curl_example(command: str, omni_fleet: Fleet, tmp_path: Path) -> None:
    url = omni_fleet.routers[0].url
    command = _ADDRESS.sub(url, command).replace("$OMNI_URL", url)
    script = (
        "set -euo pipefail\n"
        "curl() { command curl --silent --show-error --fail-with-body --max-time 60 "
        '-H "Authorization: Bearer $OMNI_API_KEY" "$@"; }\n' + command + "\n"
    )
    env = dict(os.environ, OMNI_URL=url, OMNI_API_KEY=omni_fleet.api_key)
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, timeout=120
    )
    assert done.returncode == 0, (
        f"example failed ({done.returncode}):\n{command}\nstdout: {done.stdout[-800:]!r}\n"
        f"stderr: {done.stderr[-800:]!r}"
    )


def test_extraction_rule(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text(
        "intro\n```bash\nomni-router --port 8080\ncurl -s http://localhost:8080/v1/models\n```\n"
        "<!-- not-tested: needs a GPU -->\n```bash\ncurl http://localhost:8080/x\n```\n"
        "```python\ncurl = 1\n```\n"
        "```console\n$ curl http://localhost:8080/v1/audio/speech \\\n  -d '{}' \\\n"
        "  -o out.wav\n```\n"
    )
    found = [c for _, c in curl_commands(doc)]
    assert found == [
        "curl -s http://localhost:8080/v1/models",
        "curl http://localhost:8080/v1/audio/speech \\\n-d '{}' \\\n-o out.wav",
    ]
