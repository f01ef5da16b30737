"""Scenario 8: bad input at the router and at a worker. Each gets a clear 4xx (OpenAI-style
code) or is cut off; afterwards no worker is marked unhealthy and every in-flight gauge, the
routers' and the workers', is back at zero."""

from __future__ import annotations

import asyncio
import base64
import socket
import time

import httpx
import pytest

from tests.reliability.fleet import MODEL, Fleet, wait_until

# the first test on the live fleet also waits for it to start (minutes on a busy machine)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
CHAT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def targets(fleet: Fleet) -> list[tuple[str, str, dict[str, str]]]:
    """(name, base URL, auth headers): the first router, and one worker called directly."""
    w = next(iter(fleet.workers.values()))
    return [("router", fleet.routers[0].url, fleet.auth), ("worker", w.url, fleet.worker_auth)]


def health_snapshot(fleet: Fleet) -> dict[str, tuple]:
    """Each router's opinion of each worker: routable, healthy, breaker, errors."""
    out = {}
    for r in fleet.routers:
        for w in fleet.diagnostics(r)["workers"]:
            h = w["health"]
            out[f"{r.name}/{w['id']}"] = (w["routable"], h["healthy"], h["breaker"], w["errors"])
    return out


def raw_exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes, then read until the peer closes or ``timeout``."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while piece := sock.recv(65536):
                chunks.append(piece)
        except (TimeoutError, ConnectionResetError):
            pass
        return b"".join(chunks)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def check(resp: httpx.Response, status: int, code: str | None = None) -> None:
    assert resp.status_code == status, (resp.status_code, resp.text[:300])
    if code is not None:
        assert resp.json()["error"]["code"] == code, resp.text[:300]


def bad_inputs_at(name: str, base: str, auth: dict[str, str]) -> None:
    def post(path: str, **kw) -> httpx.Response:
        headers = {**auth, **kw.pop("headers", {})}
        return httpx.post(base + path, headers=headers, timeout=30, **kw)

    json_ct = {"content-type": "application/json"}
    # malformed and truncated JSON
    check(
        post("/v1/chat/completions", content=b'{"model": ', headers=json_ct),
        400,
        "invalid_json",
    )
    check(
        post(
            "/v1/chat/completions",
            content=b'{"model": "tiny-omni", "messages": [{"ro',
            headers=json_ct,
        ),
        400,
        "invalid_json",
    )
    check(
        post("/v1/audio/speech", content=b"\xff\xfe\x00garbage", headers=json_ct),
        400,
        "invalid_json",
    )
    check(post("/v1/chat/completions", content=b"[1, 2, 3]", headers=json_ct), 400)
    check(
        post("/v1/chat/completions", json={"model": MODEL, "messages": "hi"}),
        400,
        "invalid_request",
    )
    check(post("/v1/chat/completions", json={**CHAT, "max_tokens": -1}), 400, "invalid_request")
    check(post("/v1/chat/completions", json={**CHAT, "model": 42}), 400, "invalid_request")
    # wrong content types
    check(
        post(
            "/v1/chat/completions",
            content=b'{"model": "tiny-omni"}',
            headers={"content-type": "text/plain"},
        ),
        415,
        "unsupported_media_type",
    )
    check(
        post("/v1/chat/completions", files={"file": ("a.txt", b"x")}),
        415,
        "unsupported_media_type",
    )
    r = post("/v1/audio/transcriptions", json={"model": MODEL})
    assert 400 <= r.status_code < 500 and r.json()["error"]["code"], r.text
    # huge bodies: declared, and streamed without a length
    head = "".join(f"{k}: {v}\r\n" for k, v in auth.items())
    answer = raw_exchange(port_of(base), (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n{head}"
        f"content-type: application/json\r\ncontent-length: {64 << 20}\r\n\r\n"
    ).encode() + b"{" * 1024)  # fmt: skip
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"body_too_large" in answer

    def chunks(total: int = 40 << 20, size: int = 1 << 20):
        yield (b'--zz\r\ncontent-disposition: form-data; name="file"; filename="a.wav"\r\n'
               b"content-type: audio/wav\r\n\r\nRIFF")  # fmt: skip
        for _ in range(total // size):
            yield b"\0" * size

    try:
        r = post(
            "/v1/audio/transcriptions",
            content=chunks(),
            headers={"content-type": "multipart/form-data; boundary=zz"},
        )
        check(r, 413, "body_too_large")
    except (httpx.RemoteProtocolError, httpx.WriteError):
        pass  # cut off while still uploading: also an acceptable answer to a huge body
    # invalid audio
    check(
        post(
            "/v1/audio/transcriptions",
            data={"model": MODEL},
            files={"file": ("x.wav", b"RIFF\x00\x00junk", "audio/wav")},
        ),
        400,
        "invalid_audio",
    )
    bad_part = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(b"not audio").decode(), "format": "wav"},
    }
    check(
        post(
            "/v1/chat/completions",
            json={**CHAT, "messages": [{"role": "user", "content": [bad_part]}]},
        ),
        400,
        "invalid_audio",
    )
    check(
        post(
            "/v1/chat/completions",
            json={
                **CHAT,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "input_audio",
                                "input_audio": {"data": "%%%", "format": "wav"},
                            }
                        ],
                    }
                ],
            },
        ),
        400,
    )
    # unknown models and voices
    check(post("/v1/chat/completions", json={**CHAT, "model": "gpt-99"}), 404, "model_not_found")
    check(
        post("/v1/audio/speech", json={"model": MODEL, "input": "x", "voice": "nobody"}),
        400,
        "voice_not_found",
    )
    check(
        post("/v1/audio/speech", json={"model": "nope", "input": "x", "voice": "chelsie"}),
        404,
        "model_not_found",
    )
    # unknown paths and methods
    assert httpx.get(base + "/v1/nothing-here", headers=auth, timeout=10).status_code == 404
    assert httpx.put(base + "/v1/chat/completions", headers=auth, timeout=10).status_code in (
        404,
        405,
    )
    if name == "router":
        # invalid session keys: too long, not printable, empty `user`
        for key in ("k" * 300, "tab\there", "caf\u00e9"):
            r = post(
                "/v1/chat/completions",
                json=CHAT,
                headers={"x-session-id": key} if key.isascii() else {},
            )
            if key.isascii():
                check(r, 400, "invalid_session_key")
        check(
            post("/v1/chat/completions", json={**CHAT, "user": "u" * 300}),
            400,
            "invalid_session_key",
        )
        # not HTTP at all
        answer = raw_exchange(
            port_of(base), b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64
        )
        assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer[:100]


def test_bad_inputs_router_and_worker(omni_fleet: Fleet) -> None:
    fleet = omni_fleet
    fleet.wait_idle()
    health_before = health_snapshot(fleet)
    for name, base, auth in targets(fleet):
        bad_inputs_at(name, base, auth)
    wait_until(lambda: health_snapshot(fleet) == health_before, 5, "no worker marked unhealthy")
    fleet.wait_idle(15)


async def _cut_streams(fleet: Fleet, base: str, auth: dict[str, str]) -> None:
    async with httpx.AsyncClient(timeout=30, headers=auth) as client:
        bodies = [
            ("/v1/chat/completions", {**CHAT, "max_tokens": 64, "stream": True}),
            (
                "/v1/audio/speech",
                {
                    "model": MODEL,
                    "input": "a long sentence " * 8,
                    "voice": "chelsie",
                    "response_format": "pcm",
                    "stream": True,
                },
            ),
            (
                "/v1/chat/completions",
                {
                    **CHAT,
                    "max_tokens": 32,
                    "stream": True,
                    "modalities": ["text", "audio"],
                    "audio": {"voice": "chelsie", "format": "pcm16"},
                },
            ),
        ]
        for path, body in bodies:
            async with client.stream("POST", base + path, json=body) as r:
                assert r.status_code == 200, await r.aread()
                async for _ in r.aiter_raw():
                    break  # first piece, then hang up


def test_clients_disconnecting_mid_stream_leak_nothing(omni_fleet: Fleet) -> None:
    fleet = omni_fleet
    fleet.wait_idle()
    health_before = health_snapshot(fleet)
    for _, base, auth in targets(fleet):
        asyncio.run(_cut_streams(fleet, base, auth))
    fleet.wait_idle(20)
    assert health_snapshot(fleet) == health_before


def test_slow_clients_are_cut_off(omni_fleet: Fleet) -> None:
    """Slowloris: a request head or body that trickles in is answered 408 or closed, and the
    connection does not hold anything."""
    fleet = omni_fleet
    for name, base, auth in targets(fleet):
        port = port_of(base)
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"authorization: {auth.get('Authorization', '')}\r\n"
            f"x-omni-worker-token: {auth.get('x-omni-worker-token', '')}\r\n"
            "content-length: 500\r\n\r\n"
        ).encode()
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(head + b'{"model": "tiny-omni", ')
            sock.settimeout(60)
            answer = b""
            try:
                while piece := sock.recv(4096):
                    answer += piece
            except (TimeoutError, ConnectionResetError):
                pass
        took = time.monotonic() - started
        assert took < 60, f"{name}: a stalled request body held the connection for {took:.0f}s"
        assert answer == b"" or b" 408 " in answer.split(b"\r\n", 1)[0], (name, answer[:200])
    fleet.wait_idle(15)
