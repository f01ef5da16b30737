"""``omni-router --local-workers N`` as a subprocess for tests: start it, wait for its ready
banner, find every process it started (from /proc), stop it for sure."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from fleet.redis_server import free_port
from router.local_fleet import READY_LINE
from tests.worker_procs import proc_table

REPO = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = float(os.environ.get("OMNI_TEST_READY_TIMEOUT", "400"))


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every process below ``root``."""
    table = proc_table()
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, start, _) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                frontier.append(pid)
    return found


def still_running(pids: dict[int, int]) -> list[int]:
    """Those of ``pids`` that still exist as the same process (same start time), zombies too."""
    table = proc_table()
    return [pid for pid, start in pids.items() if pid in table and table[pid][1] == start]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class LocalFleetProcess:
    """``omni-router --local-workers N --port P ...``; stdout and stderr are collected."""

    def __init__(self, workers: int, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # the console script of this environment, as the README runs it
        exe = Path(sys.executable).with_name("omni-router")
        self.argv = [str(exe), "--local-workers", str(workers), "--port", str(self.port), *args]
        self.stdout: list[str] = []
        self.stderr_path = Path(tempfile.mkstemp(prefix="omni-local-fleet-", suffix=".log")[1])
        self._stderr = self.stderr_path.open("wb")
        self.cwd = Path(tempfile.mkdtemp(prefix="omni-local-cwd-"))
        self.proc = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,  # a failing test can always kill everything it left
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.banner: str = ""

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.append(line.rstrip("\n"))

    def log(self, tail: int = 80) -> str:
        err = self.stderr_path.read_text(errors="replace").splitlines()[-tail:]
        return "stdout:\n" + "\n".join(self.stdout) + "\nstderr:\n" + "\n".join(err)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> str:
        """The banner (every line from the ready line to 'Ctrl-C ...')."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = list(self.stdout)
            for i, line in enumerate(lines):
                if line.startswith(READY_LINE):
                    end = next((j for j in range(i, len(lines)) if "Ctrl-C" in lines[j]), None)
                    if end is not None:
                        self.banner = "\n".join(lines[i : end + 1])
                        return self.banner
            if self.proc.poll() is not None:
                raise RuntimeError(f"omni-router exited {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.2)
        raise TimeoutError(f"local fleet not ready in {timeout}s:\n{self.log()}")

    def banner_field(self, name: str) -> str:
        match = re.search(rf"^\s+{name}\s+(.*)$", self.banner, re.M)
        assert match, f"no {name!r} line in the banner:\n{self.banner}"
        return match.group(1)

    def worker_pid(self, worker_id: str) -> int:
        for pid in descendants(self.proc.pid):
            line = cmdline(pid)
            if "worker.cli" in line and f"--worker-id {worker_id} " in line + " ":
                return pid
        raise LookupError(f"no process of worker {worker_id}")

    def interrupt(self, timeout: float = 90) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout)

    def interrupt_tracking(self, timeout: float = 90) -> tuple[int, dict[int, int]]:
        """SIGINT, then the exit code and every process seen below the launcher until it
        exited (so that one started while stopping is counted too)."""
        seen = descendants(self.proc.pid)
        self.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            seen.update(descendants(self.proc.pid))
            time.sleep(0.05)
        return self.proc.wait(max(0.1, deadline - time.monotonic())), seen

    def close(self) -> None:
        """Whatever state it is in: kill it and everything it started."""
        left = descendants(self.proc.pid)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        for pid in still_running(left):  # workers run in process groups of their own
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._stderr.close()
        shutil.rmtree(self.cwd, ignore_errors=True)
        # the launcher keeps the workers' logs for people; a test's are in its own output
        for run_dir in set(re.findall(r"(/\S*/omni-local-\w+)", self.log(tail=10_000))):
            shutil.rmtree(run_dir, ignore_errors=True)
        self.stderr_path.unlink(missing_ok=True)
