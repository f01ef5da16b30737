"""Byte splicing between a client and one worker after a WebSocket upgrade: the session stays on
that worker for its whole life. Flow control both ways by pausing the other side's reads."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Tunnel(asyncio.Protocol):
    """The worker side of a spliced connection."""

    __slots__ = ("client", "head", "inject", "on_close", "transport")

    def __init__(self, client: asyncio.Transport, inject: bytes, on_close: Callable[[], None]):
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.head = b""  # the worker's response head until it is complete
        self.inject = inject  # header lines added to the worker's handshake response
        self.on_close = on_close

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.inject:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head) > 65536:
                    self.transport.close()  # type: ignore[union-attr]
                return
            data = self.head[: end + 2] + self.inject + self.head[end + 2 :]
            self.inject = self.head = b""
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()
        self.on_close()

    # flow control: the client's transport paused/resumed writing
    def pause_writing(self) -> None:
        self.client.pause_reading()

    def resume_writing(self) -> None:
        self.client.resume_reading()
