"""Found by scenario 2: a request that reaches a worker in the moment between its SIGTERM and the
router learning of the drain is refused with 503 ``draining`` (nothing was done). The router
resends such a request to another worker; a streamed upload, which it no longer holds, gets the
503 itself. A worker whose stage is full (503 ``overloaded``) is treated alike; with no worker
left the client gets 429 ``overloaded``. Pinned here with one always-refusing HTTP server and
one fake worker."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from fleet.redis_server import free_port
from tests.fakes.procs import FakeWorker, Router


class Draining(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hits = 0
    code = "draining"

    def do_GET(self) -> None:
        self._answer(200, b'{"status":"alive"}', health=True)

    def do_POST(self) -> None:
        length = self.headers.get("content-length")
        if length is not None:
            self.rfile.read(int(length))
        else:  # chunked upload: read to its end
            while (size := int(self.rfile.readline().strip() or b"0", 16)) > 0:
                self.rfile.read(size + 2)
            self.rfile.readline()
        Draining.hits += 1
        error = {"message": f"refused: {self.code}", "type": "server_error", "code": self.code}
        self._answer(503, json.dumps({"error": error}).encode())

    def _answer(self, status: int, body: bytes, health: bool = False) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        if not health:
            self.send_header("x-omni-error-code", self.code)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def draining() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Draining)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("code", ["draining", "overloaded"])
def test_a_refusal_is_resent_to_another_worker(draining: str, code: str) -> None:
    good = FakeWorker("good")
    router = Router("--worker", draining, "--worker", good.url, "--policy", "round_robin")
    try:
        Draining.hits, Draining.code = 0, code
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(6):
            r = httpx.post(router.url + "/v1/chat/completions", json=body, timeout=10)
            assert r.status_code == 200, r.text
            assert r.headers["x-omni-worker-id"] == good.url.removeprefix("http://")
        assert Draining.hits >= 2, "round robin sent nothing to the draining worker"
        # the refused attempts are not failures of the worker
        diag = router.diagnostics()
        assert all(w["health"]["breaker"] == "closed" for w in diag["workers"])
        assert diag["counts"]["policy"]["retried"] == Draining.hits
        # a streamed upload is not held by the router: it cannot be resent
        hits = Draining.hits
        codes = set()
        for _ in range(2):
            r = httpx.post(
                router.url + "/v1/audio/transcriptions",
                files={"file": ("a.wav", b"RIFF" + b"\0" * 64)},
                data={"model": "fake-model"},
                timeout=10,
            )
            codes.add((r.status_code, r.json()["error"]["code"] if r.status_code != 200 else ""))
        assert Draining.hits == hits + 1
        assert (503, code) in codes
    finally:
        router.stop()
        good.stop()


def test_every_worker_full_is_429_with_retry_after(draining: str) -> None:
    router = Router("--worker", draining)
    try:
        Draining.hits, Draining.code = 0, "overloaded"
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(router.url + "/v1/chat/completions", json=body, timeout=10)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "overloaded"
        assert r.headers["retry-after"]
        assert Draining.hits == 1
        # not held against the worker
        assert router.diagnostics()["workers"][0]["health"]["breaker"] == "closed"
    finally:
        router.stop()
