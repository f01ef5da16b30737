"""What the router forwards and what it keeps when a worker refuses or vanishes: headers named
in ``Connection`` stay on their hop, a generation request whose connection is reset before any
response byte goes to another worker (a voice upload never does), and requests a worker
refuses leave no session binding behind in Redis."""

from __future__ import annotations

import asyncio
import hashlib

import httpx
import pytest

from fleet.store import FleetStore, connect
from tests.fakes.procs import FakeWorker, Router, chat, wait_for
from tests.reliability.hostile import RawWorker

pytestmark = pytest.mark.timeout(120)


def test_headers_named_in_connection_are_not_forwarded() -> None:
    worker = RawWorker(extra_headers=b"connection: x-hop\r\nx-hop: worker-only\r\nx-end: 1\r\n")
    router = Router("--worker", worker.url)
    try:
        r = chat(
            router.url,
            headers={"connection": "keep-alive, X-Secret", "x-secret": "hop", "x-kept": "end"},
        )
        assert r.status_code == 200, r.text
        head = worker.heads[-1].lower()
        assert b"\r\nx-kept: end" in head
        assert b"x-secret" not in head
        assert "x-hop" not in r.headers and r.headers["x-end"] == "1"
    finally:
        router.stop()
        worker.close()


def test_reset_before_any_byte_is_resent_for_generation_but_not_for_voices() -> None:
    resetting = [RawWorker(reset=True), RawWorker(reset=True)]
    healthy = FakeWorker("w1")
    mixed = Router("--worker", resetting[0].url, "--worker", healthy.url, name="router-mixed")
    dead = Router(*(a for w in resetting for a in ("--worker", w.url)), name="router-dead")
    try:
        for _ in range(8):  # about half go first to the resetting worker
            r = chat(mixed.url)
            assert r.status_code == 200, r.text
        assert resetting[0].heads, "no request reached the resetting worker"
        tried = sum(len(w.heads) for w in resetting)
        r = chat(dead.url)
        assert r.status_code == 502 and r.json()["error"]["code"] == "worker_unavailable"
        assert sum(len(w.heads) for w in resetting) == tried + 2  # both workers were tried
        tried += 2
        files = {"file": ("v.wav", b"RIFF" + b"\0" * 1000, "audio/wav")}
        r = httpx.post(dead.url + "/v1/audio/voices", data={"name": "v1"}, files=files)
        assert r.status_code == 502, r.text
        assert sum(len(w.heads) for w in resetting) == tried + 1  # sent once, never resent
    finally:
        mixed.stop()
        dead.stop()
        healthy.stop()
        for w in resetting:
            w.close()


def bindings(redis_url: str) -> int:
    async def count() -> int:
        store = FleetStore(connect(redis_url), "default")
        try:
            return (await store.session_bindings())[1]
        finally:
            await store.close()

    return asyncio.run(count())


def test_refused_requests_leave_no_session_binding(redis_url: str) -> None:
    workers = [FakeWorker(f"w{i}", redis_url=redis_url) for i in (1, 2)]
    router = Router("--redis-url", redis_url, name="router-bindings")
    try:
        wait_for(lambda: len(router.ready().get("detail", "x")) == 0, 10)
        for w in workers:
            w.control("fail", {"status": 400})
        for i in range(30):
            r = chat(router.url, headers={"x-session-id": f"refused-{i}"})
            assert r.status_code == 400
        wait_for(lambda: bindings(redis_url) == 0, 5)
        for w in workers:
            w.control("fail", {"status": 0})
        assert chat(router.url, headers={"x-session-id": "accepted"}).status_code == 200
        assert bindings(redis_url) == 1
    finally:
        router.stop()
        for w in workers:
            w.stop()


def test_transcription_upload_is_resent_whole_after_a_reset() -> None:
    """A transcription streams to its worker; if that worker resets before answering, the
    router sends the whole upload (kept as it streamed) to another worker, byte for byte."""
    resetting = RawWorker(reset=True)
    healthy = FakeWorker("w1")
    router = Router("--worker", resetting.url, "--worker", healthy.url, name="router-upload")
    audio = bytes(range(256)) * 2048  # 512 KB: streams in many pieces
    boundary = b"b0undary"
    body = (
        b"--" + boundary + b'\r\ncontent-disposition: form-data; name="model"\r\n\r\nm\r\n'
        b"--" + boundary + b'\r\ncontent-disposition: form-data; name="file"; '
        b'filename="a.wav"\r\ncontent-type: audio/wav\r\n\r\n' + audio + b"\r\n"
        b"--" + boundary + b"--\r\n"
    )
    headers = {"content-type": "multipart/form-data; boundary=b0undary"}

    def pieces():  # no length: sent chunked
        for i in range(0, len(body), 65536):
            yield body[i : i + 65536]

    try:
        url = router.url + "/v1/audio/transcriptions"
        for i in range(8):
            content = body if i % 2 else pieces()
            r = httpx.post(url, content=content, headers=headers, timeout=15)
            assert r.status_code == 200, r.text
            assert r.json()["sha256"] == hashlib.sha256(body).hexdigest()
        assert resetting.heads, "no upload reached the resetting worker"
    finally:
        router.stop()
        healthy.stop()
        resetting.close()
