"""Issue 12 item 2: a worker stopped the way the local fleet stops it (SIGTERM to its whole
process group, stage processes included, as Ctrl-C does) drains and exits without restarting
a stage and without an ERROR line. The same real worker also shows the daemon answering
malformed HTTP in OpenAI-style JSON (issue 13 item 7)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from fleet.redis_server import free_port
from tests.worker_procs import READY_TIMEOUT_S

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(READY_TIMEOUT_S) + 120)]
REPO = Path(__file__).resolve().parents[2]


def start_worker_group(redis_url: str, log_path: Path) -> tuple[subprocess.Popen, int]:
    """``omni-worker`` as the leader of its own process group, as the local fleet starts it."""
    port = free_port()
    argv = [sys.executable, "-m", "worker.cli", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--redis-url", redis_url, "--worker-id", f"shutdown-{port}"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, port


def wait_ready(proc: subprocess.Popen, port: int, log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, log_path.read_text(errors="replace")[-4000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(log_path.read_text(errors="replace")[-4000:])


def malformed_reply(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: w\r\nNo colon here\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def test_a_group_sigterm_drains_without_restarts_or_errors(redis_url: str) -> None:
    log_path = Path(tempfile.mkstemp(prefix="omni-worker-shutdown-", suffix=".log")[1])
    proc, port = start_worker_group(redis_url, log_path)
    try:
        wait_ready(proc, port, log_path)
        reply = malformed_reply(port)
        assert reply.startswith(b"HTTP/1.1 400"), reply
        assert b'"code":"invalid_request"' in reply and b"application/json" in reply
        os.killpg(proc.pid, signal.SIGTERM)  # the worker and every stage process at once
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    log = log_path.read_text(errors="replace")
    after = log[log.index("draining") :]
    assert "drained" in after, after
    assert not re.search(r"\bERROR\b", after), after
    assert "restarting process group" not in after, after
    assert "bye (exit 0)" in after
