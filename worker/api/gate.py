"""The ASGI layer in front of every route: shared-token auth, the body size limit (enforced
while the body arrives, never after reading it whole), lingering close after a refusal and
per-route request metrics."""

from __future__ import annotations

import asyncio
import hmac
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleet.errors import ErrorCode, OmniError, error_bytes
from worker.api.errors import scrub
from worker.metrics import Route, WorkerMetrics, status_class

OPEN_PATHS = frozenset({"/health", "/live", "/ready", "/metrics"})
TOKEN_HEADER = b"x-omni-worker-token"
ERROR_HEADER = b"x-omni-error-code"  # set by worker.api.errors on every error response

_ROUTES = (
    ("/v1/chat/", Route.CHAT),
    ("/v1/completions", Route.COMPLETIONS),
    ("/v1/audio/speech", Route.SPEECH),
    ("/v1/audio/transcriptions", Route.TRANSCRIPTION),
    ("/v1/audio/voices", Route.VOICES),
    ("/v1/models", Route.MODELS),
)


# Lingering close, as nginx does it: an error answered before the request body was read
# (401, 413, 415, a voice over its size, ...) is sent first, then the rest of the body is read
# and dropped for at most this long and this much, then the connection closes. Ordinary clients
# (urllib, requests, httpx, the openai SDK) send their whole body before reading: closing with
# their bytes unread makes the kernel send a reset that destroys the response before they read
# it. Past either bound the client gets that reset after all (a bounded cost per connection).
# A head refused before it ended (worker.api.protocol) lingers for much less: the rest of a
# real request's head and a modest body, not a hostile endless head.
LINGER_S = 10.0
LINGER_BYTES = 64 * 2**20
HEAD_LINGER_BYTES = 4 * 2**20


def route_of(path: str) -> Route:
    for prefix, route in _ROUTES:
        if path.startswith(prefix):
            return route
    return Route.OTHER


def body_too_large(limit: int) -> OmniError:
    return OmniError(
        413, ErrorCode.BODY_TOO_LARGE, f"request body exceeds this worker's limit of {limit} bytes"
    )


class Gate:
    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        max_body_bytes: int,
        metrics: WorkerMetrics,
        body_timeout: float = 60.0,
    ) -> None:
        self.app = app
        self.token = token.encode() if token else None
        self.limit = max_body_bytes
        self.body_timeout = body_timeout
        self.metrics = metrics

    def _authorised(self, headers: dict[bytes, bytes]) -> bool:
        assert self.token is not None
        given = headers.get(TOKEN_HEADER)
        auth = headers.get(b"authorization", b"")
        if given is None and auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        return given is not None and hmac.compare_digest(given, self.token)

    def _count_error(self, code: str) -> None:
        if code in self.metrics.error_codes:  # the label vocabulary stays fixed
            self.metrics.errors.labels(code).inc()

    async def _refuse(self, send: Send, exc: OmniError) -> None:
        body = error_bytes(exc.status, exc.code, scrub(exc.message), exc.param)
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        if exc.status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": exc.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        route = route_of(path)
        started = time.monotonic()
        status_seen = 0

        async def send_counted(message: Message) -> None:
            nonlocal status_seen
            if message["type"] == "http.response.start":
                status_seen = message["status"]
                for name, value in message.get("headers", ()):
                    if name == ERROR_HEADER:
                        self._count_error(value.decode())
            await send(message)

        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        # a body the client sends whether or not it is read (not one it holds back for a
        # 100 Continue that a refusal never sends)
        body_coming = (
            declared not in (None, b"0") or b"transfer-encoding" in headers
        ) and headers.get(b"expect", b"").lower() != b"100-continue"
        received = 0
        body_done = not body_coming
        stalled = False  # a 408: the client stopped sending, nothing to linger for
        error_status = False

        async def send_refusing(message: Message) -> None:
            """Lingering close for an error sent while the request body is still arriving."""
            nonlocal error_status
            if message["type"] == "http.response.start":
                error_status = message["status"] >= 400
                if error_status and not body_done:
                    message = {**message, "headers": [*message.get("headers", ()),
                                                      (b"connection", b"close")]}  # fmt: skip
            elif (
                error_status
                and not body_done
                and not stalled
                and not message.get("more_body", False)
            ):
                await send_counted({**message, "more_body": True})
                await drain()
                message = {"type": "http.response.body", "body": b""}
            await send_counted(message)

        async def drain() -> None:
            nonlocal body_done
            loop = asyncio.get_running_loop()
            deadline = loop.time() + LINGER_S
            dropped = 0
            while not body_done and dropped <= LINGER_BYTES:
                try:
                    message = await asyncio.wait_for(receive(), deadline - loop.time())
                except TimeoutError:
                    return
                if message["type"] != "http.request":
                    return
                dropped += len(message.get("body", b""))
                body_done = not message.get("more_body", False)

        try:
            refusal: OmniError | None = None
            if self.token is not None and path not in OPEN_PATHS and not self._authorised(headers):
                refusal = OmniError(
                    401,
                    ErrorCode.INVALID_API_KEY,
                    "missing or wrong worker token (Authorization: Bearer or x-omni-worker-token)",
                )
            elif declared is not None and declared.isdigit() and int(declared) > self.limit:
                refusal = body_too_large(self.limit)
            if refusal is not None:
                self._count_error(refusal.code.value)
                await self._refuse(send_refusing, refusal)
                return

            async def receive_limited() -> Message:
                nonlocal received, body_done, stalled
                if body_done:  # later calls wait for the disconnect: no deadline on those
                    return await receive()
                try:
                    message = await asyncio.wait_for(receive(), self.body_timeout)
                except TimeoutError:
                    stalled = True
                    raise OmniError(
                        408,
                        ErrorCode.REQUEST_TIMEOUT,
                        f"request body not received within {self.body_timeout:g}s",
                    ) from None
                if message["type"] == "http.request":
                    received += len(message.get("body", b""))
                    body_done = not message.get("more_body", False)
                    if received > self.limit:
                        raise body_too_large(self.limit)
                else:
                    body_done = True
                return message

            await self.app(scope, receive_limited, send_refusing)
        finally:
            if status_seen:
                self.metrics.requests.labels(route.value, status_class(status_seen)).inc()
                self.metrics.duration.labels(route.value).observe(time.monotonic() - started)
