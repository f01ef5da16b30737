"""Hostile but legitimate clients against the router (issue 13, router side): for each, what
the hostile client got, how long it took, the peak RSS of the router, the worker and Redis
while it ran, whether another client (a small chat with a session, in a loop) was served
meanwhile, and whether the router still saw its worker healthy. (While the worker refuses
every request, in the last scenario, the other client's requests are refused too.)

    python bench/hostile_router.py                 # its own Redis, fake worker and router
    python bench/hostile_router.py --idle 5000     # fewer idle connections

Starts a private redis-server, one fake worker (tests/fakes/fake_worker.py) registered in it,
and one omni-router from this checkout. Bounded: the largest input is 64 MB, every loop has a
count, idle connections are capped by this process's descriptor limit. Prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleet.redis_server import RedisServer  # noqa: E402
from fleet.store import FleetStore, connect  # noqa: E402
from tests.fakes.procs import FakeWorker, Router, wait_for  # noqa: E402
from tests.reliability.hostile import send_until_refused  # noqa: E402

MB = 1 << 20
CHAT = b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@dataclass
class Watch:
    """Samples RSS of the three processes and serves a bystander client, while a scenario runs."""

    pids: dict[str, int]
    url: str
    peak: dict[str, float] = field(default_factory=dict)
    served: int = 0
    failed: int = 0
    slowest: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Watch:
        self.threads = [
            threading.Thread(target=self._sample, daemon=True),
            threading.Thread(target=self._bystander, daemon=True),
        ]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)

    def _sample(self) -> None:
        while not self.stop.is_set():
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak.get(name, 0.0), rss_mb(pid))
            time.sleep(0.05)

    def _bystander(self) -> None:
        headers = {"content-type": "application/json", "x-session-id": "bystander"}
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    ok = client.post(self.url + "/v1/chat/completions", content=CHAT,
                                     headers=headers).status_code == 200  # fmt: skip
                except httpx.HTTPError:
                    ok = False
                took = time.monotonic() - started
                self.slowest = max(self.slowest, took)
                if ok:
                    self.served += 1
                else:
                    self.failed += 1
                time.sleep(0.1)


def answer_line(raw: bytes) -> str:
    line = raw.split(b"\r\n", 1)[0].decode("latin-1")
    return line or "(connection closed)"


# -- scenarios: each returns what the hostile client got -------------------------------------


def idle_connections(port: int, n: int) -> str:
    held: list[socket.socket] = []
    refused = 0
    try:
        for _ in range(n):
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                refused += 1
        time.sleep(3)  # probe rounds while they are held
        answered = 0
        for sock in held[-200:]:
            sock.settimeout(0.5)
            with contextlib.suppress(OSError):
                if sock.recv(12).startswith(b"HTTP/1.1 503"):
                    answered += 1
        return f"{len(held)} opened, last 200: {answered} got 503, {refused} connect errors"
    finally:
        for sock in held:
            sock.close()


def long_target(port: int) -> str:
    sent, raw = send_until_refused(port, b"GET /", b"u" * 65536, 64 * MB)
    return f"{answer_line(raw)} after {sent / MB:.2f} MB sent"


def long_header(port: int) -> str:
    sent, raw = send_until_refused(port, b"GET /live HTTP/1.1\r\nx-h: ", b"h" * 65536, 64 * MB)
    return f"{answer_line(raw)} after {sent / MB:.2f} MB sent"


def pipelined_behind_unread(port: int) -> str:
    big = b"x" * (MB - 200)
    body = b'{"model": "fake-model", "messages": [{"role": "user", "content": "' + big + b'"}]}'
    request = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
    request += b"\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        try:
            for _ in range(600):  # never reads a response
                sock.sendall(request)
                sent += 1
        except (TimeoutError, OSError):
            pass
    return f"{sent} of 600 x 1 MB POSTs sent (read only as fast as they are answered)"


def refused_sessions(url: str, redis_url: str, worker: FakeWorker) -> str:
    """2,000 requests with a session id each that the worker refuses: bindings left behind."""
    worker.control("fail", {"status": 400})
    with httpx.Client(timeout=10) as client:
        for i in range(2000):
            client.post(url + "/v1/chat/completions", content=CHAT,
                        headers={"content-type": "application/json",
                                 "x-session-id": f"hostile-{i}"})  # fmt: skip
    worker.control("fail", {"status": 0})
    time.sleep(1)

    async def count() -> int:
        store = FleetStore(connect(redis_url), "default")
        try:
            return (await store.session_bindings())[1]
        finally:
            await store.close()

    left = asyncio.run(count()) - 1  # the bystander's own session is the one other binding
    return f"2000 refused (400), session bindings they left in Redis: {left}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--idle", type=int, default=20_200, help="idle connections to open")
    a = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    idle = min(a.idle, soft - 200)
    with RedisServer() as redis:
        worker = FakeWorker("w1", redis_url=redis.url)
        router = Router("--redis-url", redis.url, "--log-level", "warning")
        try:
            wait_for(lambda: router.ready().get("ready"), 20)
            pids = {"router": router.p.pid, "worker": worker.p.pid, "redis": redis.process.pid}
            scenarios: list[tuple[str, Callable[[], str]]] = [
                (f"{idle} idle connections", lambda: idle_connections(router.port, idle)),
                ("a 64 MB URL", lambda: long_target(router.port)),
                ("a 64 MB header", lambda: long_header(router.port)),
                (
                    "600 x 1 MB pipelined behind an unread response",
                    lambda: pipelined_behind_unread(router.port),
                ),
                (
                    "2000 refused requests, one session each",
                    lambda: refused_sessions(router.url, redis.url, worker),
                ),
            ]
            print("| input | what it got | s | router RSS MB | worker RSS MB | Redis RSS MB |"
                  " other client (served / failed, slowest s) | worker healthy |")  # fmt: skip
            print("|---|---|---:|---:|---:|---:|---|---|")
            for name, run in scenarios:
                with Watch(pids, router.url) as watch:
                    started = time.monotonic()
                    got = run()
                    took = time.monotonic() - started
                    time.sleep(0.5)
                wait_for(lambda: httpx.get(router.url + "/live", timeout=1).status_code == 200)
                health = router.diagnostics()["workers"][0]["health"]
                healthy = "yes" if health["healthy"] and not health["probe_failures"] else "NO"
                print(f"| {name} | {got} | {took:.1f} | {watch.peak['router']:.0f} | "
                      f"{watch.peak['worker']:.0f} | {watch.peak['redis']:.0f} | "
                      f"{watch.served} / {watch.failed}, {watch.slowest:.2f} | {healthy} |",
                      flush=True)  # fmt: skip
        finally:
            router.stop()
            worker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
