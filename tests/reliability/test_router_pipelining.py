"""Pipelined requests on the router: answered in order, and read only as fast as they are
answered. A client that pipelines large POSTs behind a response it does not read gets its
socket paused (--max-pipelined requests queued at most), not the router's memory filled."""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator

import httptools
import orjson
import pytest

from tests.fakes.procs import FakeWorker, Router, chat
from tests.reliability.hostile import peak_rss_bytes

pytestmark = pytest.mark.timeout(120)
MB = 1 << 20


@pytest.fixture(scope="module")
def setup() -> Iterator[tuple[Router, FakeWorker]]:
    # speech streams 4 chunks 0.8 s apart: the first exchange keeps the connection busy ~3 s
    worker = FakeWorker("w1", "--chunks", "4", "--chunk-delay-ms", "800")
    router = Router("--worker", worker.url)
    yield router, worker
    router.stop()
    worker.stop()


def post(path: bytes, body: bytes) -> bytes:
    return (
        b"POST %b HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%b" % (path, len(body), body)
    )


CHAT = orjson.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})


class Responses:
    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.parser = httptools.HttpResponseParser(self)

    def on_message_complete(self) -> None:
        self.statuses.append(self.parser.get_status_code())


def test_pipelined_requests_are_answered_in_order(setup) -> None:
    router, _ = setup
    n = 30  # well over --max-pipelined: reading must pause and resume
    requests = [post(b"/v1/chat/completions", CHAT) for _ in range(n)]
    requests[7] = b"GET /live HTTP/1.1\r\nhost: x\r\n\r\n"
    responses = Responses()
    with socket.create_connection(("127.0.0.1", router.port), timeout=10) as sock:
        sock.sendall(b"".join(requests))
        while len(responses.statuses) < n:
            piece = sock.recv(65536)
            assert piece, f"closed after {len(responses.statuses)} responses"
            responses.parser.feed_data(piece)
    assert responses.statuses == [200] * n


def test_pipeline_behind_an_unread_response_is_not_buffered(setup) -> None:
    router, _ = setup
    before = peak_rss_bytes(router.p.pid)
    content = b"x" * (MB - 200)
    big = post(b"/v1/chat/completions", b'{"model": "fake-model", "messages": '
               b'[{"role": "user", "content": "' + content + b'"}]}')  # fmt: skip
    first = post(b"/v1/audio/speech", b'{"model": "fake-model", "input": "hi", "voice": "a"}')
    sent = 0
    with socket.create_connection(("127.0.0.1", router.port), timeout=10) as sock:
        sock.sendall(first)
        sock.setblocking(False)
        view = memoryview(big)
        offset = 0
        deadline = time.monotonic() + 2.0  # inside the first exchange: nothing is answered yet
        while sent < 200 * MB and time.monotonic() < deadline:
            _, writable, _ = select.select([], [sock], [], 0.1)
            if not writable:
                continue
            n = sock.send(view[offset:])
            sent += n
            offset = (offset + n) % len(big)
        grown = peak_rss_bytes(router.p.pid) - before
    # before the fix the router read all 200 MB and held it
    assert sent < 100 * MB, f"the router kept reading: {sent / MB:.0f} MB"
    assert grown < 64 * MB, f"router peak RSS grew {grown / MB:.0f} MB"
    assert chat(router.url).status_code == 200
