"""Start fake workers and real ``omni-router`` processes for tests, and stop them for sure."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from fleet.redis_server import free_port

REPO = Path(__file__).resolve().parents[2]


def wait_for(check: Callable[[], object], timeout: float = 10.0, interval: float = 0.05) -> object:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except (httpx.HTTPError, OSError) as exc:
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"condition not met in {timeout}s (last: {last!r})")


class Proc:
    def __init__(self, argv: list[str], name: str, env: dict | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log = REPO / ".pytest_cache" / f"proc-{name}-{os.getpid()}.log"
        self.log.parent.mkdir(exist_ok=True)
        self._logf = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=self._logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(os.environ, **(env or {})),
        )

    def alive(self) -> bool:
        return self.p.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if self.p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, sig)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(5)
        self._logf.close()

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class FakeWorker(Proc):
    def __init__(
        self, worker_id: str, *args: str, redis_url: str | None = None, fleet: str = "default"
    ):
        self.id = worker_id
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "tests.fakes.fake_worker", "--port", str(self.port),
                "--id", worker_id, "--fleet", fleet, *args]  # fmt: skip
        if redis_url:
            argv += ["--redis-url", redis_url]
        super().__init__(argv, f"worker-{worker_id}")
        wait_for(lambda: httpx.get(self.url + "/health", timeout=1).status_code == 200, 15)

    def stats(self) -> dict:
        return httpx.get(self.url + "/_fake/stats", timeout=5).json()

    def control(self, what: str, doc: dict | None = None) -> None:
        r = httpx.post(self.url + f"/_fake/{what}", json=doc or {}, timeout=5)
        r.raise_for_status()


class Router(Proc):
    def __init__(
        self,
        *args: str,
        port: int | None = None,
        name: str = "router",
        wait: bool = True,
        env: dict | None = None,
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "router.cli", "--port", str(self.port), "--log-level",
                "info", *args]  # fmt: skip
        super().__init__(argv, name, env)
        if wait:
            try:  # (on a loaded 2-core box one took 22 s to start, in a full run)
                wait_for(lambda: httpx.get(self.url + "/live", timeout=1).status_code == 200, 60)
            except BaseException:
                self.stop()  # not left running behind a failed fixture
                raise

    def diagnostics(self, **kw: object) -> dict:
        return httpx.get(self.url + "/diagnostics", timeout=5, **kw).json()  # type: ignore[arg-type]

    def ready(self) -> dict:
        return httpx.get(self.url + "/ready", timeout=5).json()

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=5).text


def chat(url: str, model: str = "fake-model", timeout: float = 10, **kw: object) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    body.update(kw.pop("extra", {}))  # type: ignore[arg-type]
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout, **kw)  # type: ignore[arg-type]
