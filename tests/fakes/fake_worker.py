"""A small real HTTP fake worker for router tests (raw asyncio + httptools).

Serves /health, /v1/models, /v1/chat/completions (JSON or SSE), /v1/audio/speech (chunked
audio), a WebSocket echo on /v1/realtime (the message ``close 1012`` closes with that code),
and registers itself in Redis through ``fleet.store`` (record, heartbeat, load reports,
events) when given ``--redis-url``. Test controls live under
``/_fake/``: drain, ready, leave, load (override the reported load), health (fail probes),
break (cut the next stream after N events), stats (what it received).

    python -m tests.fakes.fake_worker --port 9001 --id w1 [--redis-url redis://...]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import os
import signal
import struct
import time

import httptools
import orjson

from fleet.records import (
    Capabilities,
    Endpoint,
    EventKind,
    LoadReport,
    Modality,
    WorkerRecord,
    WorkerStatus,
)
from fleet.store import FleetStore, connect

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.in_flight = 0
        self.requests = 0
        self.request_ids: list[str] = []
        self.sessions: dict[str, int] = {}
        self.headers_seen: dict[str, list[str]] = {
            "x-omni-worker-token": [],
            "authorization": [],
            "x-omni-api-key-id": [],
        }
        self.healthy = True
        self.break_after: int | None = None
        self.fail_status = 0  # answer every generation request with this status
        self.load_override: dict | None = None
        self.last_request_end = float("-inf")  # (monotonic) for --report-busy
        self.status = WorkerStatus.STARTING
        self.store: FleetStore | None = None
        self.record: WorkerRecord | None = None
        self.started_at = time.time()  # this process's incarnation, in every record it writes
        self.ws_messages = 0
        self.id_log = open(args.id_log, "a") if args.id_log else None  # noqa: SIM115

    def stats(self) -> dict:
        return {
            "id": self.args.id,
            "requests": self.requests,
            "in_flight": self.in_flight,
            "request_ids": self.request_ids,
            "sessions": self.sessions,
            "headers_seen": self.headers_seen,
            "status": self.status.value,
            "ws_messages": self.ws_messages,
        }


def response(
    status: int, body: bytes, ctype: bytes = b"application/json", extra: bytes = b""
) -> bytes:
    reason = {200: b"OK", 404: b"Not Found", 400: b"Bad Request", 500: b"Internal Server Error"}
    return (
        b"HTTP/1.1 %d %b\r\ncontent-type: %b\r\ncontent-length: %d\r\n"
        b"x-fake-worker: 1\r\nconnection: keep-alive\r\n%b\r\n%b"
        % (status, reason.get(status, b"X"), ctype, len(body), extra, body)
    )


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class Conn(asyncio.Protocol):
    def __init__(self, state: State) -> None:
        self.s = state
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self.ws_buf = b""
        self.ws = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.task = asyncio.get_running_loop().create_task(self.serve())

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task is not None:
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        if self.ws:
            self.ws_data(data)
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self.ws = True
            self.ws_handshake()
            rest = data[exc.args[0] :]
            if rest:
                self.ws_data(rest)
        except httptools.HttpParserError:
            self.transport.write(response(400, b'{"error":"bad request"}'))  # type: ignore[union-attr]
            self.transport.close()  # type: ignore[union-attr]

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode().lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.t_head = time.time()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.parser.should_upgrade():
            return
        self.headers["t-head"] = str(self.t_head)
        self.queue.put_nowait(
            (self.parser.get_method(), self.url.decode(), self.headers, b"".join(self.body))
        )

    async def serve(self) -> None:
        while True:
            method, url, headers, body = await self.queue.get()
            await self.handle(method, url, headers, body)

    async def handle(self, method: bytes, url: str, headers: dict, body: bytes) -> None:
        s, a, w = self.s, self.s.args, self.transport.write  # type: ignore[union-attr]
        path = url.split("?", 1)[0]
        if path.startswith("/_fake/"):
            w(await self.control(path[7:], body))
            return
        if path == "/health":
            ok = s.healthy
            w(response(200 if ok else 500, b'{"ok":true}' if ok else b'{"ok":false}'))
            return
        if path == "/v1/models":
            caps = make_record(s).capabilities.model_dump(mode="json")
            data = [{"id": m, "object": "model", "owned_by": a.id, "capabilities": caps,
                     "voices": a.voices} for m in a.model]  # fmt: skip
            w(response(200, orjson.dumps({"object": "list", "data": data})))
            return
        if path == "/v1/audio/voices" and method == b"POST":  # only what the router forwarded
            s.headers_seen["x-omni-api-key-id"].append(headers.get("x-omni-api-key-id", ""))
            w(response(200, b'{"object":"voice"}'))
            return
        if path == "/v1/audio/transcriptions" and method == b"POST":
            doc = {
                "text": "fake",
                "bytes": len(body),
                "sha256": hashlib.sha256(body).hexdigest(),
                "t_head": float(headers["t-head"]),
                "t_done": time.time(),
                "chunked": headers.get("transfer-encoding") == "chunked",
            }
            w(response(200, orjson.dumps(doc)))
            return
        if path not in ("/v1/chat/completions", "/v1/audio/speech") or method != b"POST":
            w(response(404, b'{"error":{"code":"not_found"}}'))
            return
        try:
            req = orjson.loads(body)
        except orjson.JSONDecodeError:
            w(response(400, b'{"error":{"code":"invalid_json"}}'))
            return
        if s.fail_status:
            w(response(s.fail_status, b'{"error":{"code":"internal_error"}}'))
            return
        if req.get("model") not in a.model:
            w(response(404, b'{"error":{"code":"model_not_found"}}'))
            return
        s.requests += 1
        s.request_ids.append(headers.get("x-omni-request-id", ""))
        if s.id_log is not None:  # survives a SIGKILL: what reached this worker
            s.id_log.write(headers.get("x-omni-request-id", "") + "\n")
            s.id_log.flush()
        for name in s.headers_seen:
            if name in headers:
                s.headers_seen[name].append(headers[name])
        session = headers.get("x-session-id") or req.get("user")
        if session:
            s.sessions[session] = s.sessions.get(session, 0) + 1
        s.in_flight += 1
        try:
            if a.delay_ms:
                await asyncio.sleep(a.delay_ms / 1000)
            if path == "/v1/audio/speech":
                await self.audio(w)
            elif req.get("stream"):
                await self.sse(w, headers.get("x-omni-request-id", ""))
            else:
                doc = {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "model": req["model"],
                    "system_fingerprint": a.id,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                }
                w(response(200, orjson.dumps(doc)))
        finally:
            s.in_flight -= 1
            s.last_request_end = time.monotonic()

    async def sse(self, w, request_id: str) -> None:
        a = self.s.args

        def event(i: int) -> bytes:
            if a.replayable:  # a function of the request, as a real worker's reply is
                return b"data: " + orjson.dumps({"id": request_id, "i": i}) + b"\n\n"
            return b"data: " + orjson.dumps({"worker": a.id, "i": i, "t": time.time()}) + b"\n\n"

        if await self._chunked(w, b"text/event-stream\r\ncache-control: no-cache", event):
            w(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    async def audio(self, w) -> None:
        a = self.s.args
        if await self._chunked(w, b"audio/pcm", lambda i: bytes([i % 256]) * a.chunk_bytes):
            w(b"0\r\n\r\n")

    async def _chunked(self, w, content_type: bytes, body_of) -> bool:
        """The head and ``args.chunks`` chunks, ``chunk_delay_ms`` apart. False if a
        ``break_after`` set by the test aborted the connection at that chunk instead."""
        a = self.s.args
        w(
            b"HTTP/1.1 200 OK\r\ncontent-type: " + content_type + b"\r\n"
            b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
        )
        cut, self.s.break_after = self.s.break_after, None
        for i in range(a.chunks):
            if i:
                await asyncio.sleep(a.chunk_delay_ms / 1000)
            if cut is not None and i == cut:
                self.transport.abort()  # type: ignore[union-attr]
                return False
            w(chunk(body_of(i)))
        return True

    async def control(self, what: str, body: bytes) -> bytes:
        s = self.s
        if what == "stats":
            return response(200, orjson.dumps(s.stats()))
        if what == "health":
            s.healthy = orjson.loads(body)["healthy"]
        elif what == "fail":
            s.fail_status = orjson.loads(body)["status"]
        elif what == "break":
            s.break_after = orjson.loads(body)["after"]
        elif what == "load":
            s.load_override = orjson.loads(body)
            await publish_load(s)
        elif what in ("drain", "ready"):
            await set_status(s, WorkerStatus.DRAINING if what == "drain" else WorkerStatus.READY)
        elif what == "leave":
            if s.store is not None:
                await s.store.deregister(s.args.id)
                s.store = None
        else:
            return response(404, b"{}")
        return response(200, b'{"ok":true}')

    # -- WebSocket echo ------------------------------------------------------------------

    def ws_handshake(self) -> None:
        key = self.headers.get("sec-websocket-key", "").encode()
        accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
        session = self.headers.get("x-session-id", "")
        if session:
            self.s.sessions[session] = self.s.sessions.get(session, 0) + 1
        self.transport.write(  # type: ignore[union-attr]
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n"
            b"sec-websocket-accept: " + accept + b"\r\n\r\n"
        )

    def ws_data(self, data: bytes) -> None:
        self.ws_buf += data
        while len(self.ws_buf) >= 2:
            b0, b1 = self.ws_buf[0], self.ws_buf[1]
            length, pos = b1 & 0x7F, 2
            if length == 126:
                if len(self.ws_buf) < 4:
                    return
                length, pos = struct.unpack(">H", self.ws_buf[2:4])[0], 4
            elif length == 127:
                if len(self.ws_buf) < 10:
                    return
                length, pos = struct.unpack(">Q", self.ws_buf[2:10])[0], 10
            masked = b1 & 0x80
            if len(self.ws_buf) < pos + (4 if masked else 0) + length:
                return
            mask = self.ws_buf[pos : pos + 4] if masked else b"\0\0\0\0"
            pos += 4 if masked else 0
            payload = bytes(c ^ mask[i % 4] for i, c in enumerate(self.ws_buf[pos : pos + length]))
            self.ws_buf = self.ws_buf[pos + length :]
            opcode = b0 & 0x0F
            if opcode == 8:  # close
                self.transport.write(b"\x88\x00")  # type: ignore[union-attr]
                self.transport.close()  # type: ignore[union-attr]
                return
            if opcode == 1 and payload.startswith(b"close "):  # "close 1012": end with that code
                code = struct.pack(">H", int(payload[6:]))
                self.transport.write(b"\x88\x02" + code)  # type: ignore[union-attr]
                self.transport.close()  # type: ignore[union-attr]
                return
            if opcode == 1:
                self.s.ws_messages += 1
                out = f"{self.s.args.id}:".encode() + payload
                head = (
                    bytes([0x81, len(out)])
                    if len(out) < 126
                    else bytes([0x81, 126]) + struct.pack(">H", len(out))
                )
                self.transport.write(head + out)  # type: ignore[union-attr]


# -- Redis registration ----------------------------------------------------------------------


def make_record(s: State) -> WorkerRecord:
    a = s.args
    return WorkerRecord(
        id=a.id,
        url=f"http://127.0.0.1:{a.port}",
        node="fake-node",
        model=a.model[0],
        served_models=a.model,
        capabilities=Capabilities(
            endpoints=[Endpoint(e) for e in a.endpoints],
            input_modalities=[Modality.TEXT, Modality.AUDIO],
            output_modalities=[Modality(m) for m in a.outputs],
        ),
        voices=a.voices,
        capacity=a.capacity,
        prefix_cache_tokens=a.prefix_cache_tokens,
        status=s.status,
        started_at=s.started_at,
    )


async def set_status(s: State, status: WorkerStatus) -> None:
    s.status = status
    if s.store is None:
        return
    s.record = make_record(s)
    await s.store.write_record(s.record, s.args.ttl_ms)
    kind = {WorkerStatus.READY: EventKind.READY, WorkerStatus.DRAINING: EventKind.DRAINING}
    await s.store.publish_event(kind.get(status, EventKind.JOINED), s.args.id)


async def publish_load(s: State) -> None:
    if s.store is None:
        return
    extra = s.load_override or {}
    busy = extra.get("busy", {})
    if s.args.report_busy and not busy:
        # as a real worker's stages report it: the fraction of the last second spent stepping,
        # still high for a while after a request has ended (its queues are empty by then)
        since = time.monotonic() - s.last_request_end
        fraction = 1.0 if s.in_flight else max(0.0, 1.0 - since)
        busy = {"thinker": round(fraction, 3), "talker": round(fraction, 3)}
    report = LoadReport(
        worker_id=s.args.id,
        in_flight=s.in_flight,
        queue_depth=extra.get("queue_depth", {"thinker": s.in_flight}),
        busy=busy,
    )
    await s.store.publish_load(report, s.args.ttl_ms)


async def registration(s: State) -> None:
    a = s.args
    s.store = FleetStore(connect(a.redis_url), a.fleet)
    await set_status(s, WorkerStatus.STARTING)
    await set_status(s, WorkerStatus.READY)
    tick = 0
    while s.store is not None:
        await asyncio.sleep(0.1)
        tick += 1
        with contextlib.suppress(Exception):
            if tick % 2 == 0:
                await publish_load(s)
            if tick % max(1, a.ttl_ms // 300) == 0 and s.store is not None and s.record:
                await s.store.heartbeat(s.record, a.ttl_ms)


async def main_async(a: argparse.Namespace) -> None:
    s = State(a)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Conn(s), "127.0.0.1", a.port, reuse_address=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    reg = loop.create_task(registration(s)) if a.redis_url else None
    if not a.redis_url:
        s.status = WorkerStatus.READY
    print(f"fake worker {a.id} on {a.port} pid {os.getpid()}", flush=True)
    await stop.wait()
    if s.store is not None:
        with contextlib.suppress(Exception):
            await s.store.deregister(a.id)
    if reg is not None:
        reg.cancel()
    server.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--model", action="append", default=None)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--chunks", type=int, default=5)
    p.add_argument("--chunk-delay-ms", type=float, default=0.0)
    p.add_argument("--chunk-bytes", type=int, default=4800, help="audio bytes per chunk")
    p.add_argument(
        "--replayable", action="store_true", help="stream events made from the request id only"
    )
    p.add_argument("--capacity", type=int, default=64)
    p.add_argument(
        "--report-busy", action="store_true", help="report stages busy for 1 s after a request"
    )
    p.add_argument("--prefix-cache-tokens", type=int, default=0, help="reported prefix cache")
    p.add_argument(
        "--endpoints", nargs="+", default=["chat", "speech", "realtime", "transcription"]
    )
    p.add_argument("--outputs", nargs="+", default=["text", "audio"])
    p.add_argument("--voices", nargs="*", default=[], help="built-in voices it lists")
    p.add_argument("--redis-url", default=None)
    p.add_argument("--fleet", default="default")
    p.add_argument("--ttl-ms", type=int, default=1500)
    p.add_argument("--id-log", default=None, help="append each request id here at once")
    a = p.parse_args()
    a.model = a.model or ["fake-model"]
    import uvloop

    uvloop.run(main_async(a))


if __name__ == "__main__":
    main()
