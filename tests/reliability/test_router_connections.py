"""Client connections on the router: idle ones (never started, or kept alive after a response)
are closed after --client-idle-timeout-s; past the connection cap new ones get 503 while the
descriptors kept in reserve serve probes and worker connections; and the router's own
descriptor exhaustion never marks a worker unhealthy."""

from __future__ import annotations

import socket
import sys
import time

import httpx
import pytest

from fleet.redis_server import free_port
from tests.fakes.procs import FakeWorker, Proc, Router, chat, wait_for
from tests.reliability.hostile import open_fds, read_until_closed, status_and_code

pytestmark = pytest.mark.timeout(120)


def test_idle_connections_are_closed_but_busy_ones_are_not() -> None:
    worker = FakeWorker("w1", "--chunks", "4", "--chunk-delay-ms", "600")
    router = Router("--worker", worker.url, env={"OMNI_CLIENT_IDLE_TIMEOUT_S": "1"})
    try:
        never_started = socket.create_connection(("127.0.0.1", router.port), timeout=15)
        kept_alive = socket.create_connection(("127.0.0.1", router.port), timeout=15)
        kept_alive.sendall(b"GET /live HTTP/1.1\r\nhost: x\r\n\r\n")
        assert kept_alive.recv(65536).startswith(b"HTTP/1.1 200 ")
        started = time.monotonic()
        assert never_started.recv(1) == b""  # the router hung up
        assert kept_alive.recv(1) == b""
        assert time.monotonic() - started < 10
        never_started.close()
        kept_alive.close()
        # a response that takes longer than the idle timeout is not cut: the connection is busy
        body = {"model": "fake-model", "input": "hello", "voice": "alloy"}
        with httpx.stream("POST", router.url + "/v1/audio/speech", json=body, timeout=15) as r:
            assert r.status_code == 200
            assert sum(len(piece) for piece in r.iter_raw()) == 4 * 4800
        assert "omni_router_idle_connections_closed_total 2.0" in router.metrics()
    finally:
        router.stop()
        worker.stop()


def test_connection_cap_refuses_before_descriptors_run_out() -> None:
    """400 idle connections against a router allowed 300 descriptors: it refuses the ones over
    its cap with 503, keeps probing its worker without a failure, and serves once they go."""
    worker = FakeWorker("w1")
    port = free_port()
    argv = ["prlimit", "--nofile=300:300", sys.executable, "-m", "router.cli", "--port",
            str(port), "--worker", worker.url, "--probe-interval-s", "0.2"]  # fmt: skip
    router = Proc(argv, "router-capped", env={"OMNI_FD_RESERVE": "100"})
    url = f"http://127.0.0.1:{port}"
    held: list[socket.socket] = []
    try:
        wait_for(lambda: httpx.get(url + "/live", timeout=1).status_code == 200, 20)
        for _ in range(400):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(1.5)  # several probe rounds while the connections are held
        assert open_fds(router.p.pid) < 300
        refused = []
        for sock in held[-50:]:
            sock.settimeout(2)
            refused.append(read_until_closed(sock))
        assert all(status_and_code(a) == (503, "too_many_connections") for a in refused), refused[0]
        for sock in held:
            sock.close()
        wait_for(lambda: httpx.get(url + "/live", timeout=1).status_code == 200, 10)
        workers = httpx.get(url + "/diagnostics", timeout=5).json()["workers"]
        assert workers[0]["health"]["healthy"] and workers[0]["health"]["probe_failures"] == 0
        metrics = httpx.get(url + "/metrics", timeout=5).text
        assert "omni_router_health_transitions_total 0.0" in metrics
        assert "omni_router_probes_failed_total 0.0" in metrics
        assert chat(url).status_code == 200
    finally:
        for sock in held:
            sock.close()
        router.stop()
        worker.stop()
