"""Request heads on the router: a target over --max-url-bytes gets 414, a header block over
--max-header-bytes gets 431 (OpenAI-style JSON with a stable code), and a head that keeps
growing is cut off after a bounded read, never buffered or re-copied whole."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.procs import FakeWorker, Router, chat
from tests.reliability.hostile import (
    exchange,
    peak_rss_bytes,
    send_until_refused,
    status_and_code,
)

pytestmark = pytest.mark.timeout(120)
MB = 1 << 20


@pytest.fixture(scope="module")
def router() -> Iterator[Router]:
    worker = FakeWorker("w1")
    r = Router("--worker", worker.url)  # the defaults: 8 KiB target, 32 KiB of headers
    yield r
    r.stop()
    worker.stop()


def test_long_target_gets_414(router: Router) -> None:
    answer = exchange(router.port, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nhost: x\r\n\r\n")
    assert status_and_code(answer) == (414, "uri_too_long"), answer[:300]
    # one under the limit is routed as usual (here: no such route)
    target = b"/" + b"a" * 8000
    answer = exchange(router.port, b"GET " + target + b" HTTP/1.1\r\nconnection: close\r\n\r\n")
    assert status_and_code(answer) == (404, "not_found"), answer[:300]


def test_large_header_block_gets_431(router: Router) -> None:
    one_big = b"GET /live HTTP/1.1\r\nx-big: " + b"b" * 40000 + b"\r\n\r\n"
    lines = b"".join(b"x-h%d: %s\r\n" % (i, b"v" * 40) for i in range(1000))
    many = b"GET /live HTTP/1.1\r\n" + lines
    for head in (one_big, many + b"\r\n"):
        answer = exchange(router.port, head)
        assert status_and_code(answer) == (431, "headers_too_large"), answer[:300]
    assert chat(router.url).status_code == 200


def test_endless_target_is_cut_off_early_and_costs_no_memory(router: Router) -> None:
    before = peak_rss_bytes(router.p.pid)
    sent, _ = send_until_refused(router.port, b"GET /", b"u" * 65536, 48 * MB)
    # the router stopped reading soon after 8 KB (kernel buffers hold a few MB at most)
    assert sent < 24 * MB, sent
    assert peak_rss_bytes(router.p.pid) - before < 16 * MB
    assert chat(router.url).status_code == 200


def test_endless_header_is_cut_off_early_and_costs_no_memory(router: Router) -> None:
    before = peak_rss_bytes(router.p.pid)
    head = b"GET /live HTTP/1.1\r\nx-endless: "
    sent, _ = send_until_refused(router.port, head, b"h" * 65536, 48 * MB)
    assert sent < 24 * MB, sent
    assert peak_rss_bytes(router.p.pid) - before < 16 * MB
    assert chat(router.url).status_code == 200


def test_limits_hold_for_heads_that_arrive_in_pieces(router: Router) -> None:
    """The exact check also runs for a head in several small reads, none over a limit."""
    import socket
    import time

    from tests.reliability.hostile import read_until_closed

    url = b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n"
    header = b"GET /live HTTP/1.1\r\nx-big: " + b"b" * 40000 + b"\r\n\r\n"
    for pieces, expected in (
        ([url[:7000], url[7000:]], (414, "uri_too_long")),  # most of it in the first read
        ([header[i : i + 3000] for i in range(0, len(header), 3000)], (431, "headers_too_large")),
    ):
        with socket.create_connection(("127.0.0.1", router.port), timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for piece in pieces:
                sock.sendall(piece)
                time.sleep(0.05)  # separate reads on the router's side
            assert status_and_code(read_until_closed(sock)) == expected


def test_heads_in_pieces_within_the_limits_are_served_whole(router: Router) -> None:
    """A target and headers split over several reads are joined as sent (the router keeps the
    pieces only for such heads), and the next request on the connection, whole in one read,
    is served as usual."""
    import socket
    import time

    def response(sock: socket.socket) -> tuple[int, bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            body += sock.recv(65536)
        return int(head.split(b" ", 2)[1]), body[:length]

    body = b'{"model":"fake-model","messages":[{"role":"user","content":"hi"}]}'
    request = (
        b"POST /v1/chat/completions?trace=" + b"t" * 3000 + b" HTTP/1.1\r\nhost: x\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
    )
    cuts = [9, 20, 1500, 3030, 3060]  # inside the path, the query, the headers
    pieces = [request[a:b] for a, b in zip([0, *cuts], [*cuts, len(request)], strict=True)]
    with socket.create_connection(("127.0.0.1", router.port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(0.05)  # separate reads on the router's side
        status, answer = response(sock)
        assert status == 200 and b"chat.completion" in answer
        sock.sendall(b"GET /live HTTP/1.1\r\nhost: x\r\n\r\n")  # whole, in one read
        assert response(sock) == (200, b'{"status":"live"}')
