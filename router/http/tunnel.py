"""Byte splicing between a client and one worker after a WebSocket upgrade: the session stays on
that worker for its whole life. Flow control both ways by pausing the other side's reads.

The worker's bytes pass untouched (its close frame and close code included). The router only
follows their frame boundaries, reading each frame's header and skipping its payload, so that
when the worker's connection ends without a close frame (the worker died) it can tell the
client so with a close frame of its own, between two of the worker's frames."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

# RFC 6455 close codes the router itself sends
GOING_AWAY = 1001  # the router stops
WORKER_LOST = 1011  # the worker's connection ended without a close frame
NO_STATUS = 1005  # a close frame without a code (as RFC 6455 reports it)
_CLOSE = 0x8
_MAX_HEAD = 65536


def close_frame(code: int, reason: str) -> bytes:
    """A server-to-client close frame (unmasked); the reason is cut to fit a control frame."""
    payload = struct.pack(">H", code) + reason.encode()[:123]
    return bytes((0x80 | _CLOSE, len(payload))) + payload


class FrameScanner:
    """Follows one direction of a WebSocket stream frame by frame without copying payloads:
    whether the stream stands between two frames, and the code of its close frame once one
    went by."""

    __slots__ = ("close_code", "code_bytes", "header", "in_close", "left", "mask")

    def __init__(self) -> None:
        self.header = bytearray()  # an incomplete frame header
        self.left = 0  # payload bytes of the current frame still to come
        self.in_close = False  # the current frame is a close frame
        self.code_bytes = bytearray()
        self.mask = b""  # a masked close frame's key (a server's frames are never masked)
        self.close_code: int | None = None

    @property
    def between_frames(self) -> bool:
        return not self.left and not self.header

    def feed(self, data: bytes) -> None:
        pos, end = 0, len(data)
        while pos < end:
            if self.left:
                take = min(self.left, end - pos)
                if self.in_close and len(self.code_bytes) < 2:
                    self.code_bytes += data[pos : pos + min(take, 2 - len(self.code_bytes))]
                    if len(self.code_bytes) == 2:
                        code = bytes(self.code_bytes)
                        if self.mask:
                            code = bytes((code[0] ^ self.mask[0], code[1] ^ self.mask[1]))
                        self.close_code = struct.unpack(">H", code)[0]
                self.left -= take
                pos += take
                continue
            header = self.header
            want = 2 if len(header) < 2 else _header_size(header[1])
            take = min(want - len(header), end - pos)
            header += data[pos : pos + take]
            pos += take
            if len(header) < want or (want == 2 and _header_size(header[1]) > 2):
                continue  # more header bytes to come (in this read or the next)
            self._frame(header)
            header.clear()

    def _frame(self, header: bytearray) -> None:
        length = header[1] & 0x7F
        if length == 126:
            length = struct.unpack_from(">H", header, 2)[0]
        elif length == 127:
            length = struct.unpack_from(">Q", header, 2)[0]
        self.left = length
        self.in_close = header[0] & 0x0F == _CLOSE
        if self.in_close and self.close_code is None:
            self.close_code = NO_STATUS  # until its payload says otherwise
            self.mask = bytes(header[-4:]) if header[1] & 0x80 else b""


def _header_size(second: int) -> int:
    length = second & 0x7F
    return 2 + (2 if length == 126 else 8 if length == 127 else 0) + (4 if second & 0x80 else 0)


class Tunnel(asyncio.Protocol):
    """The worker side of a spliced connection."""

    __slots__ = (
        "client",
        "frames",
        "head",
        "inject",
        "on_close",
        "router_code",
        "status",
        "transport",
    )

    def __init__(
        self,
        client: asyncio.Transport,
        inject: bytes,
        on_close: Callable[[Tunnel], None],
    ) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.head = b""  # the worker's response head until it is complete
        self.inject = inject  # header lines added to the worker's handshake response
        self.on_close = on_close
        self.status = 0  # the worker's handshake answer (101: upgraded); 0 until it came
        self.frames = FrameScanner()  # the worker's frames, once upgraded
        self.router_code: int | None = None  # the close code the router itself sent

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.status == 101:
            self.frames.feed(data)
        elif not self.status:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head) > _MAX_HEAD:
                    self.transport.close()  # type: ignore[union-attr]
                return
            self.status = _status_of(self.head)
            rest = self.head[end + 4 :]
            data = self.head[: end + 2] + self.inject + self.head[end + 2 :]
            self.inject = self.head = b""
            if self.status == 101 and rest:
                self.frames.feed(rest)
        self.client.write(data)

    @property
    def upgraded(self) -> bool:
        return self.status == 101

    def end_for_client(self, code: int, reason: str) -> bool:
        """Close the client's side with ``code`` if the worker's frames allow one more (it sent
        no close frame and stands between frames); True if the close frame went out."""
        sent = (
            self.upgraded
            and self.router_code is None
            and self.frames.close_code is None
            and self.frames.between_frames
            and not self.client.is_closing()
        )
        if sent:
            self.client.write(close_frame(code, reason))
            self.router_code = code
        self.client.close()
        return sent

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_close(self)

    # flow control: the client's transport paused/resumed writing
    def pause_writing(self) -> None:
        self.client.pause_reading()

    def resume_writing(self) -> None:
        self.client.resume_reading()


def _status_of(head: bytes) -> int:
    """The status code of a response head (``HTTP/1.1 101 ...``); 502 if it has none."""
    parts = head.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return 502
    return int(parts[1])
