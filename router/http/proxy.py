"""One connection to a worker, relaying each response to the client as it arrives.

The relay is callback-driven (no task per request): httptools calls ``on_body`` for every piece
the worker sends and the piece goes straight to the client's transport. Backpressure runs the
other way: when the client's transport pauses writing, the client pauses reading here, so a slow
client slows the worker's socket instead of growing a buffer.

A stream that breaks part way (the worker died, hung, or its heartbeat lapsed) may go on from
another worker: the relay counts the body bytes it sent and keeps the last piece, and a
``Resumed`` relay on the new worker's connection drops what the client already has, checks that
the replay's bytes before that point end with the same piece, and relays the rest.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any, Protocol

import httptools

from router.http.headers import connection_named, without_headers
from router.http.sockets import peek_socket, peer_closed
from router.http.wire import DROP_RESPONSE, chunk, sse_error_event, status_line

IDLE, WAITING, BODY = 0, 1, 2
_PLAIN_CONNECTION = frozenset({b"keep-alive", b"close"})
_PLAIN_CONNECTION_AS_SENT = _PLAIN_CONNECTION | {b"Keep-Alive", b"Close"}  # no .lower() call
# A length-delimited body with at least this much in the read that carries its head is relayed
# as it comes (no parser pass, no copy); smaller bodies take the parser's path.
RAW_MIN = 16384
READ_BUFFER = 262144  # what one read from a worker takes at most (uvloop's own read size)


class _ReadBuffer:
    """The one buffer that every worker connection of this process reads into (asyncio's
    BufferedProtocol): the kernel writes a response straight into it and each read is handled
    before the next, so no read makes a bytes object (a copy of up to 256 KiB per read,
    most of what a large body cost). A slice handed to a client transport that could not
    send it all at once stays referenced there (uvloop keeps the memoryview), so the buffer
    is then replaced, and the old one lives until that write is done."""

    __slots__ = ("array", "view")

    def __init__(self) -> None:
        self.replace()

    def replace(self) -> None:
        self.array = bytearray(READ_BUFFER)
        self.view = memoryview(self.array)


_READ = _ReadBuffer()
_NO_BODY_STATUS = frozenset({204, 304})
# why a connection is dropped whose worker left the fleet (its heartbeat lapsed): a request
# still waiting for its answer is resent, a stream part way resumes elsewhere
LEFT_FLEET = "the worker left the fleet (its heartbeat lapsed)"


class Downstream(Protocol):
    """What the relay needs from the client side of an exchange."""

    transport: asyncio.Transport
    keep_alive: bool
    http11: bool
    head_only: bool
    extra_headers: bytes  # ready-made lines: request id, worker id
    uploading: bool  # the request body is still streaming to the worker
    pipeline_full: bool  # reading is paused until a pipelined request is answered
    dispatch: Any  # the request as sent; ``.retryable`` when it can be sent again

    def upstream_done(self, conn: Upstream, status: int, interrupted: str | None) -> None: ...
    def upstream_failed(self, conn: Upstream, reason: str) -> None: ...
    def upstream_refused(self, conn: Upstream, code: bytes) -> None: ...
    def upstream_reset(self, conn: Upstream) -> None: ...
    def upstream_broke(self, conn: Upstream, reason: str) -> bool: ...
    def stream_resumed(self, conn: Resumed) -> None: ...


class ConnectionPool(Protocol):
    """Where a connection goes back when its exchange is over (router.http.pool.Pool)."""

    def put(self, conn: Upstream) -> None: ...
    def discard(self, conn: Upstream) -> None: ...


class Upstream(asyncio.BufferedProtocol):
    diverged = False  # (a Resumed relay's replay that was not the same stream)
    __slots__ = (
        "answered",
        "chunked_in",
        "chunked_out",
        "client",
        "closed",
        "fail_reason",
        "first_body_at",
        "head",
        "headers",
        "last_activity",
        "last_piece",
        "parser",
        "paused",
        "pool",
        "raw_left",
        "refused",
        "sent",
        "sent_at",
        "sock",
        "sse",
        "state",
        "status",
        "transport",
        "until_close",
    )

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.sock: socket.socket | None = None
        self.client: Downstream | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.head: bytes | None = None  # response head not yet written (coalesced with body)
        self.state = IDLE
        self.status = 0
        self.chunked_in = False
        self.chunked_out = False
        self.until_close = False
        self.sse = False
        self.last_piece = b"\n\n"
        self.sent = 0  # body bytes of a chunked stream relayed to the client
        self.closed = False
        self.sent_at = 0.0
        self.last_activity = 0.0
        # when a stream's first body bytes were relayed (chunked to the client; 0: not yet, or
        # a whole response, whose first byte comes with its last)
        self.first_body_at = 0.0
        self.fail_reason = ""
        self.paused = False  # reading paused for a slow client
        # the code of a 503 that is swallowed (a draining or full worker refused before doing
        # anything): the request moves on; b"": none
        self.refused = b""
        self.answered = False  # some byte of a response to the current request came back
        # bytes of a length-delimited body still to relay unparsed; 0 whenever an exchange
        # ends (the body relayed whole, or the connection closed, never pooled)
        self.raw_left = 0

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.sock = peek_socket(transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return _READ.view

    def buffer_updated(self, nbytes: int) -> None:
        data = _READ.view[:nbytes]
        if self.state == WAITING:
            self.answered = True
            if nbytes > RAW_MIN:
                # a head followed by a large body in one read: parse the head alone, then
                # relay a length-delimited body without copying it through the parser
                end = _READ.array.find(b"\r\n\r\n", 0, nbytes) + 4
                if end >= 4 and nbytes - end >= RAW_MIN:
                    if not self._feed(data[:end]):
                        return
                    length = self._raw_body_length()
                    if length:
                        self.raw_left = length
                        self._relay_raw(data[end:])
                        return
                    data = data[end:]
        elif self.raw_left:
            self._relay_raw(data)
            return
        try:  # inline rather than self._feed(): this is the path of every response
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail_reason = f"bad response from worker: {exc}"
            self.transport.close()  # type: ignore[union-attr]
            return
        if self.head is not None and self.client is not None:
            # the head came without body bytes: send it now, a stream may wait for its first event
            self.client.transport.write(self.head)
            self.head = None

    def _raw_body_length(self) -> int:
        """The Content-Length of the body that follows the head just parsed, when it is
        relayed as it is (not chunked, not refused, a body there is); else 0."""
        client = self.client
        if (
            client is None
            or self.state != BODY
            or self.refused
            or self.chunked_out
            or self.until_close
            or self.chunked_in
            or client.head_only
            or self.status < 200
            or self.status in _NO_BODY_STATUS
        ):
            return 0
        for name, value in self.headers:
            if name.lower() == b"content-length":
                return int(value) if value.isdigit() else 0
        return 0

    def _feed(self, data: bytes | memoryview) -> bool:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.fail_reason = f"bad response from worker: {exc}"
            self.transport.close()  # type: ignore[union-attr]
            return False
        return True

    def _relay_raw(self, data: memoryview) -> None:
        """Part of a length-delimited body: straight to the client, head first if unsent (a
        slice of the read buffer, which is replaced if the client's transport keeps it)."""
        left = self.raw_left
        overrun = len(data) > left  # bytes past the body: the worker broke its framing
        if overrun:
            data = data[:left]
        self.raw_left = left - len(data)
        self.last_activity = time.monotonic()
        client = self.client
        if client is not None:
            transport = client.transport
            if self.head is not None:
                transport.writelines((self.head, data))
                self.head = None
            else:
                transport.write(data)
            if transport.get_write_buffer_size():
                _READ.replace()
        if self.raw_left == 0:
            if overrun:
                self.close()  # never pooled: its framing is lost
            self.on_message_complete()
            self.parser = httptools.HttpResponseParser(self)  # it saw the head only

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        client = self.client
        if client is None:
            self.pool.discard(self)
            return
        self.client = None
        if self.refused:
            code, self.refused = self.refused, b""
            self.state = IDLE
            client.upstream_refused(self, code)
            return
        if self.state == WAITING:
            self.state = IDLE
            if not self.answered and (not self.fail_reason or self.fail_reason is LEFT_FLEET):
                client.upstream_reset(self)  # nothing came back: the router may resend
            else:
                client.upstream_failed(self, self.fail_reason or "worker closed the connection")
            return
        self.state = IDLE
        if self.until_close and not self.fail_reason:
            self._finish(client)  # a response delimited by the end of the connection
            return
        reason = self.fail_reason or "worker connection lost mid-response"
        if self.head is not None:  # no body byte came: the client gets the head now
            client.transport.write(self.head)
            self.head = None
        # a stream another worker can take over: the client has a 200 head and a body in
        # chunks, so what follows can come from elsewhere
        if self.chunked_out and self.status == 200 and client.upstream_broke(self, reason):
            return
        end_stream(client.transport, self.sse and self.chunked_out, self.last_piece, reason)
        client.upstream_done(self, self.status, reason)

    # -- exchange --------------------------------------------------------------------------

    def usable(self) -> bool:
        return not self.closed and (self.sock is None or not peer_closed(self.sock))

    def send(self, client: Downstream, data: bytes) -> None:
        self.client = client
        self.state = WAITING
        self.headers = []
        self.head = None
        self.fail_reason = ""
        self.answered = False
        self.first_body_at = 0.0
        self.sent_at = self.last_activity = time.monotonic()
        self.transport.write(data)  # type: ignore[union-attr]

    def abort(self, reason: str) -> None:
        """Client went away or a timeout fired: drop the connection (never reused)."""
        self.fail_reason = reason
        if self.transport is not None:
            self.transport.close()

    def detach(self) -> None:
        """Forget the client (it is gone) and close; the worker sees the disconnect."""
        self.client = None
        self.state = IDLE
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # the worker's socket buffer is full while an upload streams to it: stop reading the client
    def pause_writing(self) -> None:
        client = self.client
        if client is not None and not client.transport.is_closing():
            client.transport.pause_reading()

    def resume_writing(self) -> None:
        client = self.client
        if client is not None and not client.transport.is_closing() and not client.pipeline_full:
            client.transport.resume_reading()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    # -- httptools callbacks ---------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        client = self.client
        if client is None:
            return
        status = self.parser.get_status_code()
        self.status = status
        if status == 503:
            self.refused = _refusal(self.headers, client)
            if self.refused:
                self.state = BODY
                return
        parts = [status_line(status)]
        length: bytes | None = None
        connection: list[bytes] | None = None
        chunked_in = sse = False
        for name, value in self.headers:
            lname = name.lower()
            if lname in DROP_RESPONSE:
                if lname == b"content-length":
                    length = value
                elif lname == b"transfer-encoding":
                    chunked_in = b"chunked" in value.lower()
                elif (
                    lname == b"connection"
                    and value not in _PLAIN_CONNECTION_AS_SENT
                    and value.lower() not in _PLAIN_CONNECTION
                ):
                    connection = [value] if connection is None else [*connection, value]
                continue
            if lname == b"content-type" and value.startswith(b"text/event-stream"):
                sse = True
            parts += (name, b": ", value, b"\r\n")
        if connection is not None:  # headers the worker marked hop-by-hop stay here too
            parts = [parts[0], *without_headers(parts[1:], connection_named(connection))]
        parts.append(client.extra_headers)
        self.chunked_in = chunked_in
        self.until_close = False
        self.chunked_out = False
        self.sse = sse
        self.last_piece = b"\n\n"
        if length is not None and not chunked_in:
            parts += (b"content-length: ", length, b"\r\n")
        elif not (status in _NO_BODY_STATUS or status < 200 or client.head_only):
            self.until_close = not chunked_in
            if client.http11:
                self.chunked_out = True
                self.sent = 0  # (only a chunked stream is counted: see on_body)
                parts.append(b"transfer-encoding: chunked\r\n")
            else:
                client.keep_alive = False  # HTTP/1.0: the end of the body is the end of the link
        if not client.keep_alive:
            parts.append(b"connection: close\r\n")
        elif not client.http11:
            parts.append(b"connection: keep-alive\r\n")
        parts.append(b"\r\n")
        head = b"".join(parts)
        self.state = BODY
        self.last_activity = time.monotonic()
        self.head = head  # written with the first body bytes, or at the end of this read

    def on_body(self, body: bytes) -> None:
        client = self.client
        if client is None or self.refused:
            return
        self.last_activity = now = time.monotonic()
        if self.chunked_out:
            if not self.first_body_at:
                self.first_body_at = now
            data = b"%x\r\n%b\r\n" % (len(body), body)
            self.last_piece = body  # looked at only if the stream breaks
            self.sent += len(body)
        else:
            data = body
        if self.head is not None:
            data = self.head + data
            self.head = None
        client.transport.write(data)

    def on_message_complete(self) -> None:
        """The response is relayed whole: pool the connection if it can carry another."""
        client = self.client
        if client is None:
            return
        # a worker that answered before the client's upload ended has not read the rest of
        # it: the remainder would be parsed as the next request on a pooled connection
        keep = self.parser.should_keep_alive() and not client.uploading
        self.client = None
        if self.refused:  # (a draining worker's connection is not worth pooling)
            code, self.refused = self.refused, b""
            self.state = IDLE
            self.close()
            client.upstream_refused(self, code)
            return
        self._finish(client)
        if keep and not self.closed:
            self.resume_reading()  # paused mid-feed by a slow client: pooled links must read
            self.pool.put(self)
        else:
            self.close()

    def _finish(self, client: Downstream) -> None:
        self.state = IDLE
        tail = b"0\r\n\r\n" if self.chunked_out else b""
        if self.head is not None:
            tail = self.head + tail
            self.head = None
        if tail:
            client.transport.write(tail)
        client.upstream_done(self, self.status, None)


def end_stream(transport: asyncio.Transport, sse: bool, last_piece: bytes, reason: str) -> None:
    """A broken stream that cannot go on: an SSE stream ends with a final error event the
    client can read (after the event it was in, cut short); any other body is cut, so the client
    sees it incomplete."""
    if sse:
        sep = b"" if last_piece.endswith(b"\n\n") else b"\n\n"
        transport.write(chunk(sep + sse_error_event(reason)) + b"0\r\n\r\n")
    else:
        transport.close()


class Unpooled:
    """Where a replay's connection goes when its exchange is over: closed, not pooled (its
    relay is a ``Resumed`` one, for that one response)."""

    __slots__ = ("pool",)

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool

    def put(self, conn: Upstream) -> None:
        conn.close()

    def discard(self, conn: Upstream) -> None:
        self.pool.discard(conn)


class Resumed(Upstream):
    """The relay of a stream's replay on another worker. The client already has the head and
    ``sent`` body bytes ending with ``tail``: the replay's first ``sent - len(tail)`` bytes are
    dropped, the next ones must equal ``tail`` (else the replay is another stream: it is cut,
    ``diverged``), and the rest is relayed as usual, framed in the client's chunks."""

    __slots__ = ("check", "diverged", "had", "skip")

    def __init__(self, pool: ConnectionPool, sent: int, tail: bytes, sse: bool) -> None:
        super().__init__(Unpooled(pool))
        self.had = sent
        self.skip = sent - len(tail)
        self.check = tail
        self.diverged = False
        self.sse = sse
        self.last_piece = tail or b"\n\n"

    def send(self, client: Downstream, data: bytes) -> None:
        super().send(client, data)
        self.sent = self.had

    def on_headers_complete(self) -> None:
        client = self.client
        if client is None:
            return
        status = self.parser.get_status_code()
        self.status = 200  # what the client has; the replay's own head is not relayed
        self.state = BODY
        self.chunked_out = True
        self.last_activity = time.monotonic()
        if status != 200:
            self.fail_reason = f"the replay's worker answered HTTP {status}"
            self.close()
        elif not self.skip and not self.check:
            client.stream_resumed(self)  # the client had the head only

    def on_body(self, body: bytes) -> None:
        if self.client is None or self.closed:
            return
        if self.skip:
            n = min(self.skip, len(body))
            self.skip -= n
            body = body[n:]
        if self.check and body:
            n = min(len(self.check), len(body))
            if body[:n] != self.check[:n]:
                self._diverge("the replay differs from what the client received")
                return
            self.check = self.check[n:]
            body = body[n:]
            if not self.check and not self.skip:
                self.client.stream_resumed(self)
        if body:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self.diverged or self.closed:
            return
        if self.skip or self.check:
            self._diverge("the replay ended before where the client's stream was")
            return
        super().on_message_complete()

    def _diverge(self, reason: str) -> None:
        self.diverged = True
        self.fail_reason = reason
        self.close()


def _refusal(headers: list[tuple[bytes, bytes]], client: Downstream) -> bytes:
    """A worker refuses with 503 ``draining`` (it began draining after it was chosen) or
    ``overloaded`` (one of its stages is full) before it does anything: the request can go
    elsewhere, if the router still holds all of it. The refusal's code, or b"" to relay it."""
    dispatch = client.dispatch
    if dispatch is None or not dispatch.retryable:
        return b""
    for n, v in headers:
        if n.lower() == b"x-omni-error-code":
            return v if v in (b"draining", b"overloaded") else b""
    return b""
