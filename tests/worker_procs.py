"""Real ``omni-worker`` processes for end-to-end tests and the HTTP benchmark."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from fleet.redis_server import free_port

REPO = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = float(os.environ.get("OMNI_TEST_READY_TIMEOUT", "180"))


def proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, start time in clock ticks, state) for every process."""
    table: dict[int, tuple[int, int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the command name may contain spaces or parentheses: split after the last ')'
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry.name)] = (int(fields[1]), int(fields[19]), fields[0])
    return table


class WorkerProcess:
    """``omni-worker`` in a subprocess; its log goes to a file that failures print."""

    def __init__(
        self,
        *args: str,
        redis_url: str | None = None,
        env: dict[str, str] | None = None,
        worker_id: str | None = None,
        token: str | None = None,
    ) -> None:
        self.port = free_port()
        self.worker_id = worker_id or f"w{self.port}"
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.log_path = Path(tempfile.mkstemp(prefix="omni-worker-", suffix=".log")[1])
        argv = [
            sys.executable,
            "-m",
            "worker.cli",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--worker-id",
            self.worker_id,
            *args,
        ]
        if redis_url:
            argv += ["--redis-url", redis_url]
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        if token:
            full_env["OMNI_WORKER_TOKEN"] = token
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=full_env, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def log(self, tail: int = 60) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-tail:])

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> WorkerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"omni-worker exited {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"omni-worker not ready in {timeout}s:\n{self.log()}")

    def wait_exit(self, timeout: float = 30) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(
                f"omni-worker still running after {timeout}s:\n{self.log()}"
            ) from exc

    def children(self) -> list[int]:
        """Every descendant process (stage processes and helpers), from /proc."""
        parents = {pid: ppid for pid, (ppid, _, _) in proc_table().items()}
        found: list[int] = []
        frontier = [self.pid]
        while frontier:
            parent = frontier.pop()
            kids = [pid for pid, ppid in parents.items() if ppid == parent]
            found.extend(kids)
            frontier.extend(kids)
        return sorted(found)

    @staticmethod
    def cmdline(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()

    def kill(self) -> None:
        """SIGKILL the worker and every process it started."""
        kids = self.children()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for pid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
