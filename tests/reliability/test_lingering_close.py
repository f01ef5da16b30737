"""Refusals reach ordinary clients: urllib, requests, httpx and the openai SDK write their whole
request body before reading a byte of the response. A router or worker that refuses early (413,
414, 431, 401, 415) and closes with that body unread makes the kernel reset the connection,
and the client saw ``Connection reset by peer`` instead of the JSON error (three times out of
three with a 24 MB voice upload). Both now answer, then read and drop the rest (bounded)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.fakes.procs import FakeWorker, Router
from tests.reliability.inproc_worker import InProcWorker, inproc_worker
from worker.settings import WorkerSettings

pytestmark = pytest.mark.timeout(120)

MB = 2**20
TOKEN = "linger-token"
BIG = b"x" * (24 * MB)


def whole_then_read(port: int, head: bytes, body: bytes) -> tuple[int, dict]:
    """A raw client: the whole request written, then the response read to its end."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + body)  # a reset while sending raises here
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    status = int(reply.split(b" ", 2)[1])
    return status, json.loads(reply.partition(b"\r\n\r\n")[2])


def urllib_post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    """Python's urllib, as a user's script would call it (it sends ``Connection: close``)."""
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def multipart(name: str, data: bytes) -> tuple[bytes, dict[str, str]]:
    body = (
        b'--b\r\ncontent-disposition: form-data; name="name"\r\n\r\n' + name.encode() + b"\r\n"
        b'--b\r\ncontent-disposition: form-data; name="file"; filename="v.wav"\r\n'
        b"content-type: audio/wav\r\n\r\n" + data + b"\r\n--b--\r\n"
    )
    return body, {"content-type": "multipart/form-data; boundary=b"}


def chunked(body: bytes, piece: int = MB) -> bytes:
    out = b"".join(
        b"%x\r\n%b\r\n" % (len(body[i : i + piece]), body[i : i + piece])
        for i in range(0, len(body), piece)
    )
    return out + b"0\r\n\r\n"


def refusals(host: str, auth: dict[str, str]) -> list[tuple[str, str, bytes, dict, int, str]]:
    """(what, path, body, headers, status, code): each early refusal, with a 24 MB body."""
    voice, voice_headers = multipart("big", BIG)
    json_ = {"content-type": "application/json"}
    plain = {**auth, "content-type": "text/plain"}
    chat = "/v1/chat/completions"
    return [
        ("voice over its limit", "/v1/audio/voices", voice, {**auth, **voice_headers}, 413, ""),
        ("no API key", "/v1/audio/voices", voice, voice_headers, 401, "invalid_api_key"),
        ("wrong content type", chat, BIG, plain, 415, "unsupported_media_type"),
        ("body over its limit", chat, BIG * 2, {**auth, **json_}, 413, "body_too_large"),
    ]


def check_refusals(base: str, auth: dict[str, str], voice_code: str) -> None:
    for what, path, body, headers, status, code in refusals(base, auth):
        for _ in range(3):
            got, doc = urllib_post(base + path, body, headers)
            assert got == status, (what, got, doc)
            assert doc["error"]["code"] == (code or voice_code), (what, doc)


def check_heads(port: int, auth: bytes) -> None:
    """414 and 431 on a request that also carries a (modest: a head refused before it ends
    lingers for a few MB, not for a hostile endless head) body; a chunked body over the limit."""
    small = BIG[: 2 * MB]
    tail = b"Host: x\r\n" + auth + b"Content-Type: application/json\r\n"
    long_target = b"POST /v1/chat/completions?" + b"a" * (200 * 1024) + b" HTTP/1.1\r\n"
    request_line = b"POST /v1/chat/completions HTTP/1.1\r\n"
    big_header = b"X-Big: " + b"h" * (200 * 1024) + b"\r\n"
    length = b"Content-Length: %d\r\n\r\n" % len(small)
    heads = [
        (long_target + tail + length, small, 414),
        (request_line + tail + big_header + length, small, 431),
        (request_line + tail + b"Transfer-Encoding: chunked\r\n\r\n", chunked(BIG * 2), 413),
    ]
    for head, body, status in heads:
        got, doc = whole_then_read(port, head, body)
        assert got == status, (status, doc)
        assert doc["error"]["code"] in ("uri_too_long", "headers_too_large", "body_too_large")


@pytest.fixture(scope="module")
def worker(redis_server) -> Iterator[InProcWorker]:
    settings = WorkerSettings(
        _cli_parse_args=[],
        token=TOKEN,
        max_voice_upload_bytes=MB,
        max_body_bytes=32 * MB,
        max_head_bytes=64 * 1024,
    )
    with inproc_worker(settings, redis_server.url) as w:
        yield w


def test_the_worker_answers_a_client_that_sends_its_whole_body_first(
    worker: InProcWorker,
) -> None:
    check_refusals(worker.url, {"Authorization": f"Bearer {TOKEN}"}, "voice_too_large")
    check_heads(worker.port, b"Authorization: Bearer " + TOKEN.encode() + b"\r\n")
    # the connection is not held after the client is done (its EOF ends the lingering)
    assert worker.service.in_flight == 0


def test_the_router_answers_a_client_that_sends_its_whole_body_first() -> None:
    fake = FakeWorker("w1")
    router = Router(
        "--worker", fake.url, "--max-body-bytes", str(32 * MB), "--api-key", "sk-linger",
        "--max-header-bytes", str(64 * 1024), "--max-url-bytes", str(64 * 1024),
    )  # fmt: skip
    try:
        # the fake takes any voice: the router's own refusals are what is tested here
        auth = {"Authorization": "Bearer sk-linger"}
        for what, path, body, headers, status, code in refusals(router.url, auth):
            if status == 413 and not code:
                continue  # a voice's own size limit is the worker's (above)
            for _ in range(3):
                got, doc = urllib_post(router.url + path, body, headers)
                assert got == status, (what, got, doc)
                assert doc["error"]["code"] == code, (what, doc)
        check_heads(router.port, b"Authorization: Bearer sk-linger\r\n")
        # and the router still serves
        ok = urllib_post(
            router.url + "/v1/chat/completions",
            json.dumps({"model": "fake-model", "messages": []}).encode(),
            {**auth, "content-type": "application/json"},
        )
        assert ok[0] == 200
    finally:
        router.stop()
        fake.stop()


def test_a_workers_early_refusal_of_an_upload_reaches_the_client_through_the_router(
    worker: InProcWorker,
) -> None:
    """The worker refuses a voice over its limit mid-upload; the router relays the 413 and
    lingers on the rest of the client's body."""
    router = Router("--worker", worker.url, "--worker-token", TOKEN, "--max-body-bytes",
                    str(32 * MB))  # fmt: skip
    try:
        body, headers = multipart("big", BIG)
        for _ in range(3):
            got, doc = urllib_post(router.url + "/v1/audio/voices", body, headers)
            assert got == 413 and doc["error"]["code"] == "voice_too_large", doc
    finally:
        router.stop()
