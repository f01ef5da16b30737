"""Hostile but legitimate clients against one worker's HTTP layer (issue 13, worker side):
audio decompression bombs, oversize prompts, voice uploads past their quotas, and the small
ones (object reprs in messages, a name with a trailing newline, a client gone mid-body,
malformed HTTP). The worker is served in this process exactly as the daemon serves it, with
its registration and heartbeat in a real Redis, over real HTTP on loopback, on the test-only
FakePipeline. Every input is a few MB at most."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import io
import socket
import threading
import time

import httpx
import numpy as np
import pytest
import redis
import soundfile as sf

from fleet.errors import OmniError
from fleet.keys import FleetKeys
from fleet.records import PCM16_24K, VoiceRecord
from tests.reliability.inproc_worker import FLEET, InProcWorker, captured_logs, inproc_worker
from worker.api import audio
from worker.settings import WorkerSettings

pytestmark = pytest.mark.timeout(120)

KEYS = FleetKeys(FLEET)
VOICE_SECONDS = 2.0
VOICE_STORED = int(VOICE_SECONDS * 24_000) * 2  # bytes of a stored voice: 24 kHz mono pcm16


def settings(**overrides) -> WorkerSettings:
    base = {
        "heartbeat_interval": 0.2,
        "heartbeat_ttl": 1.0,
        "max_audio_decoded_bytes": 16 * 2**20,
        "max_audio_seconds": 60.0,
    }
    return WorkerSettings(_cli_parse_args=[], **(base | overrides))


@pytest.fixture
def worker(redis_url: str):
    with inproc_worker(settings(), redis_url) as w:
        yield w


def encode(samples: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def tone(seconds: float, rate: int, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    mono = (0.3 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    return np.repeat(mono[:, None], channels, axis=1) if channels > 1 else mono


def silent_flac(seconds: float, rate: int, channels: int) -> bytes:
    """Silence compresses to almost nothing: a few KB that decode to tens of MB."""
    buf = io.BytesIO()
    block = np.zeros((rate, channels), dtype=np.int16)
    with sf.SoundFile(buf, "w", rate, channels, format="FLAC", subtype="PCM_16") as out:
        for _ in range(int(seconds)):
            out.write(block)
    return buf.getvalue()


def error_of(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert body["error"]["code"] == code, body
    return body["error"]["message"]


def transcribe(w: InProcWorker, data: bytes, timeout: float = 30) -> httpx.Response:
    return httpx.post(
        w.url + "/v1/audio/transcriptions",
        data={"model": "fake-omni"},
        files={"file": ("a.flac", data)},
        timeout=timeout,
    )


def upload_voice(
    w: InProcWorker, name: str, data: bytes, key_id: str | None = None
) -> httpx.Response:
    headers = {"x-omni-api-key-id": key_id} if key_id else {}
    return httpx.post(
        w.url + "/v1/audio/voices",
        data={"name": name},
        files={"file": ("v.wav", data)},
        headers=headers,
        timeout=30,
    )


# -- 1. audio decompression bombs -------------------------------------------------------------


def test_a_decompression_bomb_is_refused_from_its_header(worker: InProcWorker) -> None:
    bomb = silent_flac(10, 96_000, 8)  # ~20 KB; 30 MB once decoded to float32
    assert len(bomb) < 100_000
    with pytest.raises(OmniError) as err:
        audio.decode_audio(bomb, max_seconds=60, max_decoded_bytes=16 * 2**20)
    assert err.value.code == "audio_too_large"
    message = error_of(transcribe(worker, bomb), 400, "audio_too_large")
    assert "96000 Hz x 8 channel(s)" in message
    voice = upload_voice(worker, "bomb", bomb)
    error_of(voice, 400, "audio_too_large")
    assert worker.pipeline.seen == []  # nothing reached the pipeline


def test_a_header_without_a_length_is_refused() -> None:
    data = bytearray(silent_flac(2, 16_000, 1))
    # STREAMINFO's 36-bit total-samples field = 0: "unknown", so libsndfile cannot bound it
    packed = int.from_bytes(data[18:26], "big") & ~((1 << 36) - 1)
    data[18:26] = packed.to_bytes(8, "big")
    with pytest.raises(OmniError) as err:
        audio.decode_audio(bytes(data), max_seconds=60)
    assert err.value.code == "invalid_audio"


@pytest.mark.parametrize(
    ("fmt", "subtype"),
    [("WAV", "PCM_16"), ("FLAC", None), ("MP3", None), ("OGG", "VORBIS"), ("OGG", "OPUS")],
)
def test_every_usual_format_decodes_to_mono_16k(fmt: str, subtype: str | None) -> None:
    data = encode(tone(1.0, 48_000, 2), 48_000, fmt, subtype)
    mono = audio.decode_audio(data, max_seconds=5)
    assert mono.dtype == np.float32
    assert abs(mono.size - 16_000) <= 1_200  # mp3 and opus pad a frame or two
    rms = float(np.sqrt(np.mean(mono[2000:-2000] ** 2)))
    assert 0.15 < rms < 0.28, rms  # a 0.3 sine has an rms of 0.21


def test_multichannel_decoding_keeps_memory_near_the_mono_result() -> None:
    """Each block is down-mixed as it is decoded: 8 channels cost no more than one."""
    import tracemalloc

    data = silent_flac(4, 48_000, 8)  # 6 MB as 8-channel float32, 0.75 MB mono
    tracemalloc.start()
    try:
        audio.decode_audio(data, max_seconds=60, target_rate=48_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, peak


def chat_with_audio(w: InProcWorker, data: bytes) -> httpx.Response:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode()}}
    return httpx.post(
        w.url + "/v1/chat/completions",
        json={"model": "fake-omni", "messages": [{"role": "user", "content": [part]}]},
        timeout=30,
    )


@pytest.mark.parametrize(
    "send",
    [
        pytest.param(lambda w, data: upload_voice(w, "slow", data), id="voice-upload"),
        pytest.param(chat_with_audio, id="chat-input-audio"),
        pytest.param(transcribe, id="transcription"),
    ],
)
def test_decoding_runs_off_the_event_loop_and_the_heartbeat_lives(
    worker: InProcWorker, redis_url: str, monkeypatch: pytest.MonkeyPatch, send
) -> None:
    """A decode that takes long (held here until the test has looked) leaves the loop free:
    /health answers and the Redis heartbeat key never expires meanwhile."""
    release = threading.Event()
    decoding_on: list[str] = []
    original = sf.SoundFile._open

    def held_open(self, *args, **kwargs):
        decoding_on.append(threading.current_thread().name)
        release.wait(timeout=30)
        return original(self, *args, **kwargs)

    data = encode(tone(1.0, 16_000), 16_000, "WAV")
    monkeypatch.setattr(sf.SoundFile, "_open", held_open)
    r = redis.Redis.from_url(redis_url)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        request = pool.submit(send, worker, data)
        try:
            deadline = time.monotonic() + 10
            while not decoding_on:
                assert time.monotonic() < deadline and not request.done(), "no decode started"
                time.sleep(0.01)
            # held for 2.5 heartbeat TTLs: the key must be there every time we look
            until = time.monotonic() + 2.5 * worker.service.settings.heartbeat_ttl
            while time.monotonic() < until:
                assert r.pttl(worker.heartbeat_key) > 0, "the worker's record expired"
                health = httpx.get(worker.url + "/health", timeout=3)
                assert health.status_code == 200
                time.sleep(0.1)
            assert not request.done()
        finally:
            release.set()
        assert request.result().status_code == 200, request.result().text
    assert decoding_on[0].startswith("audio-decode"), decoding_on


# -- 2. prompts refused by size before any work ----------------------------------------------


def chat(w: InProcWorker, content: str, timeout: float = 30) -> httpx.Response:
    return httpx.post(
        w.url + "/v1/chat/completions",
        json={"model": "fake-omni", "messages": [{"role": "user", "content": content}]},
        timeout=timeout,
    )


def test_an_oversize_prompt_is_refused_before_any_work(worker: InProcWorker) -> None:
    limit = 32 * 4096  # the fake spec's default context length, 32 bytes a token
    assert chat(worker, "x" * limit).status_code == 200
    seen = len(worker.pipeline.seen)
    for content in ("x" * (limit + 1), "é" * (limit // 2 + 1), "word " * 2_000_000):
        message = error_of(chat(worker, content), 400, "context_length_exceeded")
        assert str(limit) in message
    parts = [{"type": "text", "text": "y" * (limit // 2 + 1)}] * 2
    r = httpx.post(
        worker.url + "/v1/chat/completions",
        json={"model": "fake-omni", "messages": [{"role": "user", "content": parts}]},
        timeout=30,
    )
    error_of(r, 400, "context_length_exceeded")
    speech = httpx.post(
        worker.url + "/v1/audio/speech",
        json={"model": "fake-omni", "voice": "tiny", "input": "z" * (limit + 1)},
        timeout=30,
    )
    error_of(speech, 400, "context_length_exceeded")
    assert len(worker.pipeline.seen) == seen  # none of them reached the pipeline


def test_the_prompt_limit_is_a_setting(redis_url: str) -> None:
    with inproc_worker(settings(max_prompt_bytes=2048), redis_url) as w:
        assert chat(w, "x" * 2048).status_code == 200
        error_of(chat(w, "x" * 2049), 400, "context_length_exceeded")


# -- 6. voices: stored in the model's form, within quotas -------------------------------------


def test_a_voice_is_stored_as_24k_mono_pcm16(worker: InProcWorker, redis_url: str) -> None:
    upload = tone(VOICE_SECONDS, 48_000, 4)  # 4 channels at 48 kHz: 1.5 MB as uploaded
    data = encode(upload, 48_000, "WAV", "PCM_16")
    r = upload_voice(worker, "four-channels", data)
    assert r.status_code == 200, r.text
    assert r.json()["bytes"] == VOICE_STORED and "owner" not in r.json()
    client = redis.Redis.from_url(redis_url)
    assert client.strlen(KEYS.voice_audio("four-channels")) == VOICE_STORED
    record = VoiceRecord.model_validate_json(client.hget(KEYS.voices, "four-channels"))
    assert record.format == PCM16_24K and record.seconds == VOICE_SECONDS
    assert int(client.get(KEYS.voice_bytes)) == VOICE_STORED
    speech = httpx.post(
        worker.url + "/v1/audio/speech",
        json={"model": "fake-omni", "input": "hi", "voice": "four-channels"},
        timeout=30,
    )
    assert speech.status_code == 200, speech.text
    reference = worker.pipeline.seen[-1].voice_audio
    expected = tone(VOICE_SECONDS, 16_000)
    assert reference.dtype == np.float32 and reference.size == expected.size
    assert np.abs(reference[100:-100] - expected[100:-100]).max() < 0.01


def test_a_too_long_or_too_large_voice_is_refused(redis_url: str) -> None:
    with inproc_worker(settings(max_voice_upload_bytes=64 * 1024), redis_url) as w:
        big = encode(tone(1.0, 48_000, 2), 48_000, "WAV", "PCM_16")  # 192 KB
        error_of(upload_voice(w, "big", big), 413, "voice_too_large")
        long = encode(tone(31.0, 1_000), 1_000, "WAV", "PCM_16")  # 31 s in 62 KB at 1 kHz
        error_of(upload_voice(w, "long", long), 400, "audio_too_long")
        # a declared 20 MB upload is refused from its Content-Length, before its body
        with socket.create_connection(("127.0.0.1", w.port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/audio/voices HTTP/1.1\r\nHost: w\r\n"
                b"Content-Type: multipart/form-data; boundary=b\r\n"
                b"Content-Length: 20000000\r\n\r\n"
            )
            reply = sock.recv(65536)
        assert reply.startswith(b"HTTP/1.1 413"), reply[:300]
        assert b"voice_too_large" in reply


def test_the_fleet_quota_holds_under_concurrent_uploads(redis_url: str) -> None:
    quota = 3 * VOICE_STORED
    data = encode(tone(VOICE_SECONDS, 16_000), 16_000, "WAV", "PCM_16")
    with inproc_worker(settings(voice_quota_bytes=quota), redis_url) as w:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: upload_voice(w, f"v{i}", data), range(8)))
        codes = sorted(r.status_code for r in results)
        assert codes == [200] * 3 + [429] * 5, [r.text for r in results]
        refused = next(r for r in results if r.status_code == 429)
        assert refused.json()["error"]["code"] == "voice_quota_exceeded"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        client = redis.Redis.from_url(redis_url)
        assert int(client.get(KEYS.voice_bytes)) == quota
        kept = next(r.json()["name"] for r in results if r.status_code == 200)
        # replacing a voice with one of the same size is not growth; deleting frees its share
        assert upload_voice(w, kept, data).status_code == 200
        assert httpx.delete(f"{w.url}/v1/audio/voices/{kept}", timeout=10).status_code == 200
        assert int(client.get(KEYS.voice_bytes)) == quota - VOICE_STORED
        assert upload_voice(w, "another", data).status_code == 200


def test_each_api_key_has_its_own_quota(redis_url: str) -> None:
    data = encode(tone(VOICE_SECONDS, 16_000), 16_000, "WAV", "PCM_16")
    with inproc_worker(settings(voice_quota_bytes_per_key=VOICE_STORED), redis_url) as w:
        assert upload_voice(w, "a1", data, key_id="key-a").status_code == 200
        error_of(upload_voice(w, "a2", data, key_id="key-a"), 429, "voice_quota_exceeded")
        assert upload_voice(w, "b1", data, key_id="key-b").status_code == 200
        assert upload_voice(w, "a1", data, key_id="key-a").status_code == 200  # a replacement
        client = redis.Redis.from_url(redis_url)
        usage = client.hgetall(KEYS.voice_bytes_by_owner)
        assert usage == {b"key-a": str(VOICE_STORED).encode(), b"key-b": usage[b"key-b"]}
        # another key can neither replace nor delete it (or free its own quota that way)
        error_of(upload_voice(w, "a1", data, key_id="key-b"), 403, "permission_denied")
        as_b = {"x-omni-api-key-id": "key-b"}
        refused = httpx.delete(f"{w.url}/v1/audio/voices/a1", headers=as_b, timeout=10)
        error_of(refused, 403, "permission_denied")
        as_a = {"x-omni-api-key-id": "key-a"}
        assert httpx.delete(f"{w.url}/v1/audio/voices/a1", headers=as_a, timeout=10).is_success
        assert upload_voice(w, "a2", data, key_id="key-a").status_code == 200


# -- 7. the small ones ------------------------------------------------------------------------


def test_error_messages_carry_no_object_reprs(worker: InProcWorker) -> None:
    for response in (
        transcribe(worker, b"\x00not audio at all" * 10),
        upload_voice(worker, "garbage", b"RIFF\x00\x00\x00\x00WAVEjunk"),
    ):
        message = error_of(response, 400, "invalid_audio")
        assert " at 0x" not in message and "object" not in message, message


def test_a_voice_name_with_a_trailing_newline_is_refused(worker: InProcWorker) -> None:
    data = encode(tone(0.5, 16_000), 16_000, "WAV")
    error_of(upload_voice(worker, "ok\n", data), 400, "invalid_request")
    assert upload_voice(worker, "ok", data).status_code == 200


def send_partial_body(port: int, path: str, content_type: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: w\r\nContent-Type: {content_type}\r\n"
            "Content-Length: 100000\r\n\r\n"
        )
        sock.sendall(head.encode() + b"--b\r\n" + b"a" * 1000)


def test_a_client_gone_mid_body_logs_no_error(worker: InProcWorker) -> None:
    with captured_logs() as logs:
        for path, kind in (
            ("/v1/chat/completions", "application/json"),
            ("/v1/audio/voices", "multipart/form-data; boundary=b"),
            ("/v1/audio/transcriptions", "multipart/form-data; boundary=b"),
        ):
            send_partial_body(worker.port, path, kind)
        # the worker notices each disconnect; afterwards it still serves
        deadline = time.monotonic() + 10
        while worker.service.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        assert chat(worker, "hello").status_code == 200
        time.sleep(0.3)  # let the server's tasks for the dead connections finish
    assert logs.errors() == []


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE / NOPE\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: w\r\nNo colon here\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: nope\r\n\r\n",
    ],
)
def test_malformed_http_gets_an_openai_style_error(worker: InProcWorker, raw: bytes) -> None:
    with socket.create_connection(("127.0.0.1", worker.port), timeout=10) as sock:
        sock.sendall(raw)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), reply
    assert b"content-type: application/json" in head.lower()
    error = httpx.Response(400, content=body).json()["error"]
    assert error["code"] == "invalid_request" and error["type"] == "invalid_request_error"


def send_head(port: int, head: bytes) -> bytes:
    """Send a request head in pieces until the worker answers; the answer (or b"")."""
    import select

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for i in range(0, len(head), 16 * 1024):
            try:
                sock.sendall(head[i : i + 16 * 1024])
            except (BrokenPipeError, ConnectionResetError):
                break
            if select.select([sock], [], [], 0.01)[0]:
                break
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)  # done sending: the worker closes at once
        reply = b""
        try:
            while chunk := sock.recv(65536):
                reply += chunk
        except ConnectionResetError:
            pass
        return reply


def test_request_heads_are_bounded(redis_url: str) -> None:
    """uvicorn grows a URL with ``+=`` (a 64 MB one cost 10 s of the event loop) and keeps any
    header: past --max-head-bytes the worker answers 414 / 431 and closes."""
    with inproc_worker(settings(max_head_bytes=32 * 1024), redis_url) as w:
        url = b"GET /" + b"a" * 2**20 + b" HTTP/1.1\r\nHost: w\r\n\r\n"
        header = b"GET /health HTTP/1.1\r\nHost: w\r\nX-Big: " + b"a" * 2**20 + b"\r\n\r\n"
        many = b"GET /health HTTP/1.1\r\n" + b"X-H: 0123456789abcdef\r\n" * 50_000 + b"\r\n"
        for head, status, code in (
            (url, 414, "uri_too_long"),
            (header, 431, "headers_too_large"),
            (many, 431, "headers_too_large"),
        ):
            reply = send_head(w.port, head)
            first, _, rest = reply.partition(b"\r\n")
            assert first.startswith(b"HTTP/1.1 %d" % status), reply[:300]
            body = rest.partition(b"\r\n\r\n")[2]
            assert httpx.Response(status, content=body).json()["error"]["code"] == code
        # heads under the limit are served as before
        near = {f"x-h{i}": "v" * 200 for i in range(100)}  # ~21 KB of headers
        assert httpx.get(w.url + "/health", headers=near, timeout=10).status_code == 200
        r = httpx.get(w.url + "/" + "b" * 20_000, timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def read_all(sock: socket.socket) -> bytes:
    reply = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


def test_idle_and_trickled_heads_time_out(redis_url: str) -> None:
    """uvicorn arms its keep-alive timer only after a response: a connection that never sent
    a byte, or sent half a head, was kept forever, one file descriptor each."""
    with inproc_worker(settings(head_timeout=1.0), redis_url) as w:
        with socket.create_connection(("127.0.0.1", w.port), timeout=15) as idle:
            assert read_all(idle) == b""  # closed by the worker, without a word
        with socket.create_connection(("127.0.0.1", w.port), timeout=15) as slow:
            slow.sendall(b"GET /health HTTP/1.1\r\nHost: w\r\n")  # ... and nothing more
            reply = read_all(slow)
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), reply[:300]
        assert httpx.Response(408, content=body).json()["error"]["code"] == "request_timeout"

        # a request that takes longer than head_timeout once its head is in is not cut
        async def clear_hold() -> None:
            w.pipeline.hold.clear()

        asyncio.run_coroutine_threadsafe(clear_hold(), w.loop).result(timeout=5)
        try:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                held = pool.submit(chat, w, "HOLD this")
                time.sleep(1.5)
                w.loop.call_soon_threadsafe(w.pipeline.hold.set)
                assert held.result().status_code == 200
        finally:
            w.loop.call_soon_threadsafe(w.pipeline.hold.set)


def test_a_late_pipelined_head_never_lands_inside_a_response(redis_url: str) -> None:
    """A head trickled behind a request still being answered: the 408 must not be written
    into that answer."""
    with inproc_worker(settings(head_timeout=1.0), redis_url) as w:

        async def clear_hold() -> None:
            w.pipeline.hold.clear()

        asyncio.run_coroutine_threadsafe(clear_hold(), w.loop).result(timeout=5)
        body = b'{"model": "fake-omni", "messages": [{"role": "user", "content": "HOLD"}]}'
        with socket.create_connection(("127.0.0.1", w.port), timeout=15) as sock:
            try:
                sock.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: w\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                    % len(body)
                    + body
                    + b"GET /health HTTP/1.1\r\nHo"  # ... and the rest never comes
                )
                time.sleep(2.5)  # past two head timeouts, the chat still held
            finally:
                w.loop.call_soon_threadsafe(w.pipeline.hold.set)
            reply = read_all(sock)
        assert reply.startswith(b"HTTP/1.1 200"), reply[:300]
        first, _, rest = reply.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in first.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))  # fmt: skip
        assert b'"chat.completion"' in rest[:length]
        assert rest[length:].startswith(b"HTTP/1.1 408"), rest[length:][:200]


def test_connections_are_capped(redis_url: str) -> None:
    with inproc_worker(settings(max_connections=16), redis_url) as w:
        idle = [socket.create_connection(("127.0.0.1", w.port), timeout=10) for _ in range(16)]
        try:
            with socket.create_connection(("127.0.0.1", w.port), timeout=10) as extra:
                reply = read_all(extra)
            head, _, body = reply.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503"), reply[:300]
            assert httpx.Response(503, content=body).json()["error"]["code"] == "overloaded"
        finally:
            for sock in idle:
                sock.close()
        deadline = time.monotonic() + 10
        while True:  # the closed ones leave the worker's count as it notices
            try:
                if httpx.get(w.url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the worker never served again"
            time.sleep(0.05)


def test_refusals_are_logged_as_a_summary(worker: InProcWorker) -> None:
    """A client sending hundreds of malformed or oversize requests costs the log a few lines,
    not one each (uvicorn's own per-request warning included)."""
    with captured_logs() as logs:
        for i in range(200):
            raw = b"GARBAGE\r\n\r\n" if i % 2 else b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n"
            send_head(worker.port, raw)
    warnings = [r.getMessage() for r in logs.records]
    assert len(warnings) <= 2, warnings
