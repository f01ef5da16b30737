"""The HTTP/1.1 protocol the worker serves: uvicorn's own (httptools when installed, else
h11), with two changes uvicorn cannot be configured for, because they happen before any ASGI
code runs:

- a request it cannot parse gets the worker's OpenAI-style JSON error instead of uvicorn's
  plain-text "Invalid HTTP request received.";
- the request head (request line and headers) is bounded: uvicorn's httptools protocol grows
  the URL with ``+=`` and httptools a header value likewise, so a 64 MB URL cost 10 s of the
  event loop (the heartbeat with it) and a 64 MB header 300 MB. Past ``max_head_bytes`` the
  client gets 414 (the URL) or 431 (the headers) and the connection closes;
- a head must arrive within ``head_timeout`` seconds: uvicorn arms its keep-alive timer only
  after a response, so a connection that never sends a byte, or trickles its head, was kept
  forever (each one a file descriptor the worker needs for Redis and its stages). An idle new
  connection is closed; a partial head gets 408;
- at most ``max_connections`` at once: one more gets 503 ``overloaded`` at once, so the worker
  keeps descriptors for Redis, its stage processes and the routers' probes.

These apply to the httptools protocol (uvicorn's default, a dependency of this package); the
h11 fallback gets the head size limit only."""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

from fleet.errors import ErrorCode, error_bytes
from worker.api import refusals
from worker.api.gate import HEAD_LINGER_BYTES, LINGER_S
from worker.api.refusals import REFUSALS
from worker.settings import WorkerSettings

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is optional for uvicorn
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

DEFAULT_MAX_HEAD_BYTES = 64 * 1024
DEFAULT_HEAD_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 4096
_REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    414: b"URI Too Long",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


def error_response(
    status: int, code: ErrorCode, message: str, default_headers: list[tuple[bytes, bytes]]
) -> bytes:
    """A complete error response; the connection closes after it (its framing is unknown)."""
    body = error_bytes(status, code, message)
    head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status])]
    head += [name + b": " + value + b"\r\n" for name, value in default_headers]
    head += [
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"x-omni-error-code: " + code.value.encode() + b"\r\n",
        b"connection: close\r\n\r\n",
    ]
    return b"".join(head) + body


def malformed_response(reason: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    message = f"malformed HTTP request: {reason.rstrip('.')}"
    return error_response(400, ErrorCode.INVALID_REQUEST, message, default_headers)


class JsonErrorsH11(H11Protocol):
    """h11 bounds the head itself (``h11_max_incomplete_event_size``) and answers 400."""

    def send_400_response(self, msg: str) -> None:
        # Written raw: h11's state machine is in its error state after a parse failure.
        self.transport.write(malformed_response(msg, self.server_state.default_headers))
        self.transport.close()


if HttpToolsProtocol is not None:

    class JsonErrorsHttpTools(HttpToolsProtocol):
        max_head_bytes = DEFAULT_MAX_HEAD_BYTES
        head_timeout = DEFAULT_HEAD_TIMEOUT_S
        max_connections = DEFAULT_MAX_CONNECTIONS

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._in_head = False
            self._messages = 0
            self._head_bytes = 0
            self._url_bytes = 0
            self._lingering: int | None = None  # bytes discarded since the refusal
            self._head_refused = False  # on_headers_complete found the head over the limit
            self._head_deadline: asyncio.TimerHandle | None = None
            super().connection_made(transport)
            if len(self.connections) > self.max_connections:
                message = f"this worker holds its limit of {self.max_connections} connections"
                self._refuse(503, ErrorCode.OVERLOADED, message)
                return
            # the first request's head is due within head_timeout of the connection
            self._head_deadline = self.loop.call_later(self.head_timeout, self._head_late)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head = True
            self._messages += 1
            self._head_bytes = 0
            self._url_bytes = 0
            if self._head_deadline is None:  # a later request on a kept-alive connection
                self._head_deadline = self.loop.call_later(self.head_timeout, self._head_late)

        def _head_late(self) -> None:
            self._head_deadline = None
            if self.transport.is_closing():
                return
            if not self._in_head:  # connected, never sent a byte: nobody to answer
                REFUSALS.refused("idle connection closed")
                self.transport.close()
                return
            if self._responding():  # a pipelined head behind a response still streaming
                self._head_deadline = self.loop.call_later(self.head_timeout, self._head_late)
                return
            message = f"request head not received within {self.head_timeout:g}s"
            self._refuse(408, ErrorCode.REQUEST_TIMEOUT, message)

        def on_url(self, url: bytes) -> None:
            self._url_bytes += len(url)
            super().on_url(url)

        def on_headers_complete(self) -> None:
            self._in_head = False
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None
            # A head that came whole in one large read was never counted in data_received:
            # its exact size, before uvicorn starts the request. (The raise stops httptools;
            # send_400_response below answers with the refusal.)
            size = sum(len(name) + len(value) + 4 for name, value in self.headers)
            if max(size, self._url_bytes) > self.max_head_bytes:
                self._head_bytes = size
                self._head_refused = True
                raise _HeadTooLarge
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            if self._lingering is not None:
                self._linger(len(data))
                return
            before = (self._in_head, self._messages)
            super().data_received(data)
            if not self._in_head or self.transport.is_closing():
                return
            # A chunk fed while one message's head was open, and still open after it, is all
            # head: the count is exact from a message's second chunk on, so the head can
            # outgrow the limit by one read at most.
            if before == (True, self._messages):
                self._head_bytes += len(data)
            if max(self._head_bytes, self._url_bytes) > self.max_head_bytes:
                self._refuse_head()

        def _refuse_head(self) -> None:
            limit = self.max_head_bytes
            if self._url_bytes > limit:
                status, code = 414, ErrorCode.URI_TOO_LONG
                message = f"the request URL is over this worker's limit of {limit} bytes"
            else:
                status, code = 431, ErrorCode.HEADERS_TOO_LARGE
                message = f"the request headers are over this worker's limit of {limit} bytes"
            self._refuse(status, code, message)

        def _responding(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is not None and not cycle.response_complete

        def _refuse(self, status: int, code: ErrorCode, message: str) -> None:
            """Answer before any ASGI code ran, then close the connection."""
            REFUSALS.refused(f"{status} {code.value}", message)
            self._in_head = False
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None
            if self._responding():
                # a pipelined request behind a response still being written: an answer now
                # would land inside that response; the connection goes instead
                self.transport.close()
                return
            headers = self.server_state.default_headers
            self.transport.write(error_response(status, code, message, headers))
            # Lingering close (worker.api.gate): read and drop what the client still sends
            # (bounded), then close, so that its reset does not destroy the answer.
            self._lingering = 0
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)

        def _linger(self, size: int) -> None:
            assert self._lingering is not None
            self._lingering += size
            if self._lingering > HEAD_LINGER_BYTES:
                self.transport.close()

        def eof_received(self) -> None:
            if self._lingering is not None:
                self.transport.close()
                return
            super().eof_received()

        def send_400_response(self, msg: str) -> None:
            if self._head_refused:
                self._head_refused = False
                self._refuse_head()
                return
            self.transport.write(malformed_response(msg, self.server_state.default_headers))
            self.transport.close()


class _HeadTooLarge(Exception):
    """Raised from the parser's headers-complete callback to stop it (httptools re-raises it
    from feed_data as an HttpParserCallbackError)."""


def http_protocol(
    max_head_bytes: int = DEFAULT_MAX_HEAD_BYTES,
    head_timeout: float = DEFAULT_HEAD_TIMEOUT_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> type[asyncio.Protocol]:
    """What uvicorn's ``http="auto"`` would pick, with JSON errors, a bounded and timed head
    and a connection cap (give uvicorn ``h11_max_incomplete_event_size=max_head_bytes`` too,
    for the h11 fallback)."""
    refusals.install()
    if HttpToolsProtocol is None:
        return JsonErrorsH11
    limits = {
        "max_head_bytes": max_head_bytes,
        "head_timeout": head_timeout,
        "max_connections": max_connections,
    }
    return type("WorkerHttpTools", (JsonErrorsHttpTools,), limits)


def worker_http_protocol(settings: WorkerSettings) -> type[asyncio.Protocol]:
    return http_protocol(settings.max_head_bytes, settings.head_timeout, settings.max_connections)
