"""The client side: one protocol instance per client connection (HTTP/1.1 keep-alive,
pipelining answered in order, WebSocket upgrades spliced to a worker). It parses and bounds
requests; what to do with them is the router's (the narrow ``Handler`` interface below)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import httptools

from fleet.errors import ErrorCode
from router.http.proxy import WAITING
from router.http.wire import error_response

# POST bodies that routing does not need (multipart uploads): streamed, not buffered; every
# one of these paths starts with /v1/audio/
# no side effect: may go to a second worker
RESENDABLE_UPLOADS = frozenset({b"/v1/audio/transcriptions", b"/v1/audio/translations"})
STREAMED_UPLOADS = RESENDABLE_UPLOADS | {b"/v1/audio/voices", b"/v1/audio/voice_consents"}
# Lingering close, as nginx does it (and the worker, worker/api/gate.py): a request refused
# before its body was read (413, 414, 431, 401, 415, a worker's early answer to an upload) is
# answered, the sending side shut down, then what the client still sends is read and dropped
# for at most this long and this much before the connection closes. Ordinary clients (urllib,
# requests, httpx, the openai SDK) write their whole body before reading: a close with their
# bytes unread makes the kernel send a reset that destroys the response before they read it.
# A head refused before it ended (one growing without bound, as a hostile client sends it)
# lingers for much less: the rest of a real request's head and a modest body.
LINGER_S = 10.0
LINGER_BYTES = 64 * 2**20
HEAD_LINGER_BYTES = 4 * 2**20

if TYPE_CHECKING:
    from router.dispatch import Dispatch
    from router.http.proxy import Resumed, Upstream
    from router.view import WorkerState


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """What one client connection may send (413 / 414 / 431, and pipelining backpressure)."""

    max_body: int
    max_url: int
    max_header_bytes: int
    max_pipelined: int


class ConnectionMetrics(Protocol):
    """The counters a client connection bumps itself (router.metrics.Metrics)."""

    idle_closed: int

    def request(self, route: str, status: int, seconds: float) -> None: ...
    def error(self, route: str, code: ErrorCode) -> None: ...


class Handler(Protocol):
    """What a client connection needs from the router (router.request_path.RequestPath): its
    limits and counters, where parsed requests go, and where each exchange with a worker ends
    (the ``upstream_*`` calls of the relay, passed on with the client)."""

    @property
    def limits(self) -> ClientLimits: ...
    @property
    def metrics(self) -> ConnectionMetrics: ...

    def connection_opened(self, client: ClientConnection) -> bytes | None:
        """None: the connection is served; else the response that refuses it (then closed)."""
        ...

    def connection_closed(self, client: ClientConnection) -> None: ...
    def handle(self, client: ClientConnection, req: Request) -> None: ...
    def start_websocket(self, client: ClientConnection, req: Request) -> None: ...
    def exchange_done(
        self, client: ClientConnection, conn: Upstream, status: int, interrupted: str | None
    ) -> None: ...
    def exchange_failed(self, client: ClientConnection, conn: Upstream, reason: str) -> None: ...
    def exchange_refused(self, client: ClientConnection, conn: Upstream, code: bytes) -> None: ...
    def exchange_reset(self, client: ClientConnection, conn: Upstream) -> None: ...
    def exchange_broke(self, client: ClientConnection, conn: Upstream, reason: str) -> bool: ...
    def stream_resumed(self, client: ClientConnection, conn: Resumed) -> None: ...
    def exchange_aborted(self, client: ClientConnection) -> None: ...


class Lingering(asyncio.Protocol):
    """A refused connection's protocol from the refusal on: it reads and drops what arrives
    (the parser is done with it), until the client's EOF, ``budget`` bytes or ``LINGER_S``.
    Swapped in with ``transport.set_protocol``: the served path pays nothing for it."""

    __slots__ = ("budget", "client", "dropped", "timer", "transport")

    def __init__(self, client: ClientConnection, budget: int) -> None:
        self.client = client
        self.transport = client.transport
        self.budget = budget
        self.dropped = 0
        self.timer = asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)

    def data_received(self, data: bytes) -> None:
        self.dropped += len(data)
        if self.dropped > self.budget:
            self.transport.close()

    def eof_received(self) -> bool:
        return False  # the client is done sending: the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.timer.cancel()
        self.client.connection_lost(exc)


class HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a request head over a size limit."""


class Request:
    """One parsed request. ``body`` is None for a streamed upload (it follows separately)."""

    __slots__ = ("body", "headers", "http11", "keep_alive", "method", "upgrade", "url")

    def __init__(
        self,
        method: bytes,
        url: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes | None,
        keep_alive: bool,
        http11: bool,
        upgrade: bool,
    ) -> None:
        self.method = method
        self.url = url
        self.headers = headers  # (lower-case name, value)
        self.body = body
        self.keep_alive = keep_alive
        self.http11 = http11
        self.upgrade = upgrade


class ClientConnection(asyncio.Protocol):
    __slots__ = (
        "body",
        "body_size",
        "busy",
        "closed",
        "dispatch",
        "extra_headers",
        "handler",
        "head_check",
        "head_error",
        "head_only",
        "head_rx",
        "headers",
        "http11",
        "in_head",
        "in_request",
        "keep_alive",
        "max_body",
        "max_header_bytes",
        "max_pipelined",
        "max_url",
        "parser",
        "paused",
        "pending",
        "pending_bytes",
        "pipeline_full",
        "route",
        "rx",
        "rx_seen",
        "small_head",
        "stall_at",
        "started",
        "transport",
        "tunnel",
        "upgrade_req",
        "upload_buf",
        "upload_chunked",
        "upload_ended",
        "upload_kept",
        "upload_length",
        "upload_sink",
        "uploading",
        "upstream",
        "url",
        "url_parts",
        "url_size",
        "worker",
        "ws_pending",
    )

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        limits = handler.limits
        self.max_body = limits.max_body
        self.max_url = limits.max_url
        self.max_header_bytes = limits.max_header_bytes
        # a head that came in one read no longer than this is within both limits: unchecked
        self.small_head = min(self.max_url, self.max_header_bytes)
        self.max_pipelined = limits.max_pipelined
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        # A request target that comes in pieces (it spans reads) is collected here and joined
        # once, when the head is complete: linear in its size.
        self.url_parts: list[bytes] | None = None
        self.url_size = 0  # bytes in url_parts
        self.in_head = False  # a request head is partly parsed
        # The head being parsed may be over a limit: it came in more than one read, or in a
        # read longer than small_head. A head that came whole in one short read cannot be,
        # and skips the exact check (the common request: no per-header counting).
        self.head_check = False
        self.head_rx = -1  # bytes of the head's reads after the one it began in (-1: none yet)
        self.head_error: tuple[int, ErrorCode, str] | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.body_size = 0
        # pipelined requests behind the one being answered; reading pauses while it is full
        self.pending: deque[Request] = deque()
        self.pending_bytes = 0
        self.pipeline_full = False
        self.busy = False
        self.closed = False
        self.paused = False
        self.keep_alive = True
        self.http11 = True
        self.head_only = False
        self.extra_headers = b""
        self.upstream: Upstream | None = None
        self.worker: WorkerState | None = None
        self.dispatch: Dispatch | None = None  # the current request, as sent (for a resend)
        self.route = "other"
        self.started = 0.0
        self.tunnel: asyncio.Transport | None = None
        self.upgrade_req: Request | None = None
        self.ws_pending: bytearray | None = None  # client bytes that came before the tunnel
        # request bodies that routing does not read (uploads) stream to the worker
        self.uploading = False  # the current request's body is still arriving
        self.upload_ended = False
        self.upload_chunked = False
        self.upload_length: bytes | None = None
        self.upload_sink: Upstream | None = None
        self.upload_buf: list[bytes] = []  # upload pieces that came before the worker connection
        # every piece of a transcription upload, so that it can go to another worker if its
        # worker resets the connection before answering (None: not kept, as for voices)
        self.upload_kept: list[bytes] | None = None
        # slow-client detection (router sweep): reads so far, as last seen, and since when
        self.in_request = False  # a request head or body is partly received
        self.rx = 0
        self.rx_seen = -1  # != rx: the sweep starts this connection's idle clock
        self.stall_at = 0.0

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        refusal = self.handler.connection_opened(self)
        if refusal is not None:
            self.closed = True
            transport.write(refusal)
            transport.close()

    def data_received(self, data: bytes) -> None:
        self.rx += 1
        if self.tunnel is not None:
            self.tunnel.write(data)
            return
        if self.ws_pending is not None:
            self.ws_pending += data
            return
        if len(data) > self.small_head:
            self.head_check = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            req = self.upgrade_req
            self.upgrade_req = None
            if req is not None and not self.closed:
                self.ws_pending = bytearray(data[exc.args[0] :])
                self.handler.start_websocket(self, req)
            return
        except httptools.HttpParserError:
            if not self.closed:
                error = self.head_error
                if error is None:
                    self.reject(400, ErrorCode.INVALID_REQUEST, "malformed HTTP request")
                else:
                    self.reject(*error)
            return
        if self.in_head:
            self._head_continues(len(data))

    def _head_continues(self, read: int) -> None:
        """A read ended inside a request head. httptools reports a header only once it is
        complete and buffers it until then, so a head's growth is bounded here: by the
        target's size, and by the reads after the one the request began in."""
        self.head_check = True
        if self.head_rx < 0:
            self.head_rx = 0  # the head began in this read, which may end an earlier request
        else:
            self.head_rx += read
        if self.closed:
            return
        url_size = len(self.url) if self.url_parts is None else self.url_size
        if url_size > self.max_url:
            self.reject(*self._target_too_long())
        elif self.head_rx > self.max_url + self.max_header_bytes:
            self.reject(*self._headers_too_large())

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.handler.connection_closed(self)
        self.pending.clear()
        self.pending_bytes = 0
        if self.tunnel is not None:
            self.tunnel.close()
        upstream = self.upstream
        if upstream is not None:
            self.upstream = None
            upstream.detach()  # the worker sees the disconnect and can abort its work
            self.handler.exchange_aborted(self)

    def pause_writing(self) -> None:
        self.paused = True
        if self.upstream is not None:
            self.upstream.pause_reading()
        if self.tunnel is not None:
            self.tunnel.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if self.upstream is not None:
            self.upstream.resume_reading()
        if self.tunnel is not None:
            self.tunnel.resume_reading()

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_request = True
        self.in_head = True
        self.url = b""
        self.headers = []
        self.body = []
        self.body_size = 0

    def on_url(self, url: bytes) -> None:
        # called once per read that carries part of the target
        if self.url:
            self._url_piece(url)
        else:
            self.url = url

    def _url_piece(self, url: bytes) -> None:
        """A later piece of a target that spans reads."""
        parts = self.url_parts
        if parts is None:
            parts = self.url_parts = [self.url]
            self.url_size = len(self.url)
        parts.append(url)
        self.url_size += len(url)
        self.head_check = True  # joined (and checked) when the head is complete

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def _target_too_long(self) -> tuple[int, ErrorCode, str]:
        message = f"request target is longer than {self.max_url} bytes"
        return 414, ErrorCode.URI_TOO_LONG, message

    def _headers_too_large(self) -> tuple[int, ErrorCode, str]:
        message = f"request headers are larger than {self.max_header_bytes} bytes"
        return 431, ErrorCode.HEADERS_TOO_LARGE, message

    def _head_over_limit(self) -> tuple[int, ErrorCode, str] | None:
        """The exact check, for a head that may be over a limit (it came in many reads or in
        one large one)."""
        if len(self.url) > self.max_url:
            return self._target_too_long()
        size = 0
        for name, value in self.headers:
            size += len(name) + len(value) + 4  # ": " and CRLF, as on the wire
        return self._headers_too_large() if size > self.max_header_bytes else None

    def on_headers_complete(self) -> None:
        self.in_head = False
        if self.head_check:
            self.head_check = False
            self.head_rx = -1
            parts = self.url_parts
            if parts is not None:
                self.url_parts = None
                self.url = b"".join(parts)
            error = self._head_over_limit()
            if error is not None:
                self.head_error = error
                raise HeadTooLarge
        length = expect = None
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == b"expect":
                expect = value
        if length is not None and length.isdigit() and int(length) > self.max_body:
            self.too_large()
            return
        if expect is not None and expect.lower() == b"100-continue" and not self.closed:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the client waits for it
        if self.busy or self.closed or self.parser.get_method() != b"POST":
            return
        if not self.url.startswith(b"/v1/audio/"):  # every streamed upload's prefix
            return
        path = self.url.split(b"?", 1)[0]
        if path in STREAMED_UPLOADS or path.startswith(b"/v1/audio/voices/"):
            # routing needs nothing from this body: dispatch now, stream the body behind it
            self.uploading = True
            self.upload_ended = False
            self.upload_buf = []
            self.upload_kept = [] if path in RESENDABLE_UPLOADS else None
            self.upload_length = length
            self.upload_chunked = length is None
            parser = self.parser
            self.start(
                Request(
                    b"POST",
                    self.url,
                    self.headers,
                    None,
                    parser.should_keep_alive(),
                    parser.get_http_version() == "1.1",
                    False,
                )
            )

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        if self.body_size > self.max_body:
            self.too_large()
            return
        if self.uploading:
            if self.upload_kept is not None:
                self.upload_kept.append(body)
            if self.upload_sink is None:
                self.upload_buf.append(body)
            else:
                self.upload_sink.transport.write(  # type: ignore[union-attr]
                    b"%x\r\n%b\r\n" % (len(body), body) if self.upload_chunked else body
                )
            return
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.in_request = False
        if self.closed:
            return
        if self.uploading:
            self.uploading = False
            if self.upload_sink is None:
                self.upload_ended = True  # buffered until the worker connection is ready
            else:
                if self.upload_chunked:
                    self.upload_sink.transport.write(b"0\r\n\r\n")  # type: ignore[union-attr]
                self.upload_sink = None
            return
        parser = self.parser
        body = self.body
        req = Request(
            parser.get_method(),
            self.url,
            self.headers,
            body[0] if len(body) == 1 else b"".join(body),
            parser.should_keep_alive(),
            parser.get_http_version() == "1.1",
            parser.should_upgrade(),
        )
        if req.upgrade:
            self.upgrade_req = req  # handled when the parser stops at the upgrade
            return
        if self.busy:
            self.queue(req)
        else:
            self.start(req)

    def queue(self, req: Request) -> None:
        """A pipelined request waits for the current exchange. Reading stops once the pipeline
        holds ``max_pipelined`` requests or a body's worth of bytes, so a client that never
        reads its responses cannot make the router buffer an unbounded stream of requests."""
        self.pending.append(req)
        self.pending_bytes += len(req.body or b"")
        if len(self.pending) >= self.max_pipelined or self.pending_bytes >= self.max_body:
            self.pipeline_full = True
            self.transport.pause_reading()

    # -- exchanges -------------------------------------------------------------------------

    def start(self, req: Request) -> None:
        self.busy = True
        self.keep_alive = req.keep_alive
        self.http11 = req.http11
        self.head_only = req.method == b"HEAD"
        self.started = time.monotonic()
        self.handler.handle(self, req)

    def finish(self) -> None:
        """The current exchange is over: close, or answer the next pipelined request."""
        self.busy = False
        self.rx_seen = -1  # the idle clock starts now (at the next sweep)
        self.upstream = None
        self.worker = None
        self.upload_sink = None
        self.upload_ended = False
        self.upload_kept = None
        unread = self.uploading  # answered before its body ended: the rest is read and dropped
        if unread:
            self.uploading = False
            self.keep_alive = False
        if self.closed:
            return
        if not self.keep_alive:
            if unread:
                self.linger(LINGER_BYTES)
            else:
                self.closed = True
                self.transport.close()
        elif self.pending:
            req = self.pending.popleft()
            self.pending_bytes -= len(req.body or b"")
            if self.pipeline_full:
                self.pipeline_full = False
                self.transport.resume_reading()
            self.start(req)

    def respond(self, data: bytes, status: int) -> None:
        """A response made by the router itself."""
        if self.head_only:  # HEAD: the same head, no body (RFC 9110 9.3.2)
            data = data[: data.find(b"\r\n\r\n") + 4]
        if not self.closed:
            self.transport.write(data)
        self.handler.metrics.request(self.route, status, time.monotonic() - self.started)
        self.finish()

    def reject(self, status: int, code: ErrorCode, message: str, linger: bool = True) -> None:
        """An error before any request could be dispatched (parse errors, size limits)."""
        self.handler.metrics.error("other", code)
        self.handler.metrics.request("other", status, 0.0)
        self.transport.write(error_response(status, code, message, keep_alive=False))
        if linger:
            self.linger(HEAD_LINGER_BYTES if self.in_head else LINGER_BYTES)
        else:
            self.closed = True
            self.transport.close()
        if self.upstream is not None:
            self.upstream.detach()
            self.upstream = None
            self.handler.exchange_aborted(self)

    def linger(self, budget: int) -> None:
        """Close after the response written so far, without resetting it (``Lingering``)."""
        self.closed = True
        self.transport.set_protocol(Lingering(self, budget))
        self.transport.resume_reading()  # a full pipeline or a paused upload stopped it
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the response ends here; the client reads it whole

    def idle_out(self) -> None:
        """No request under way for the idle timeout: hang up (RFC 9112 9.8 lets a server
        close an idle persistent connection at any time)."""
        self.handler.metrics.idle_closed += 1
        self.closed = True
        self.transport.close()

    def stalled(self, timeout: float) -> None:
        """The client sent nothing for ``timeout`` seconds in the middle of its request."""
        upstream = self.upstream
        if upstream is None or upstream.state == WAITING:  # no response bytes sent yet
            message = f"request not received within {timeout:g}s"
            self.reject(408, ErrorCode.REQUEST_TIMEOUT, message, linger=False)  # nothing comes
        else:  # a response is already under way: all that is left is to hang up
            self.closed = True
            self.transport.close()

    def too_large(self) -> None:
        if not self.closed:
            self.reject(
                413,
                ErrorCode.BODY_TOO_LARGE,
                f"request body is larger than {self.max_body} bytes",
            )

    def rewind_upload(self) -> bool:
        """Make a kept upload ready to be sent again from its start (to another worker)."""
        if self.upload_kept is None:
            return False
        self.upload_buf = list(self.upload_kept)
        self.upload_sink = None
        self.upload_ended = not self.uploading
        if self.uploading and not self.pipeline_full and not self.closed:
            self.transport.resume_reading()  # the lost worker may have paused the upload
        return True

    def upload_attached(self, conn: Upstream) -> None:
        """The worker connection for a streamed upload is ready: send what arrived so far."""
        pieces, self.upload_buf = self.upload_buf, []
        chunked = self.upload_chunked
        write = conn.transport.write  # type: ignore[union-attr]
        for piece in pieces:
            write(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
        if self.upload_ended:
            self.upload_ended = False
            if chunked:
                write(b"0\r\n\r\n")
        else:
            self.upload_sink = conn

    # called by the relay (router.http.proxy.Upstream)
    def upstream_done(self, conn: Upstream, status: int, interrupted: str | None) -> None:
        self.handler.exchange_done(self, conn, status, interrupted)

    def upstream_failed(self, conn: Upstream, reason: str) -> None:
        self.handler.exchange_failed(self, conn, reason)

    def upstream_refused(self, conn: Upstream, code: bytes) -> None:
        self.handler.exchange_refused(self, conn, code)

    def upstream_reset(self, conn: Upstream) -> None:
        self.handler.exchange_reset(self, conn)

    def upstream_broke(self, conn: Upstream, reason: str) -> bool:
        return self.handler.exchange_broke(self, conn, reason)

    def stream_resumed(self, conn: Resumed) -> None:
        self.handler.stream_resumed(self, conn)
