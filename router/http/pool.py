"""Keep-alive connections to one worker: a LIFO stack of idle upstream connections."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.http.proxy import Upstream

_PEEK_FLAGS = socket.MSG_PEEK | socket.MSG_DONTWAIT


class Pool:
    __slots__ = ("closed", "host", "idle", "max_idle", "port")

    def __init__(self, host: str, port: int, max_idle: int) -> None:
        self.host = host
        self.port = port
        self.max_idle = max_idle
        self.idle: list[Upstream] = []
        self.closed = False

    def take(self) -> Upstream | None:
        """An idle connection that the worker has not closed, or None. Synchronous: the hot path
        uses it without a task. Most recently used first, so that spare connections age out."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if conn.usable():
                return conn
            conn.close()
        return None

    def put(self, conn: Upstream) -> None:
        if self.closed or len(self.idle) >= self.max_idle:
            conn.close()
        else:
            self.idle.append(conn)

    def discard(self, conn: Upstream) -> None:
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)

    async def connect(self, factory: type[Upstream], timeout_s: float) -> Upstream:
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: factory(self), self.host, self.port), timeout_s
        )
        return conn

    def idle_count(self) -> int:
        return len(self.idle)

    def close(self) -> None:
        self.closed = True
        idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()


def peek_socket(transport: asyncio.Transport) -> socket.socket | None:
    """A duplicate of the transport's socket, used only to peek for EOF on idle connections."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    try:
        return socket.socket(fileno=os.dup(sock.fileno()))
    except OSError:
        return None


_TCP_INFO = getattr(socket, "TCP_INFO", None)  # Linux
_ESTABLISHED = b"\x01"  # first byte of struct tcp_info: tcpi_state


def peer_closed(sock: socket.socket) -> bool:
    """True if the peer closed (or reset) the connection. A killed worker's sockets are closed
    by its kernel at once, so this sees it before we write a request that would never reach it.
    The TCP state (one getsockopt, no exception) is cheaper than a MSG_PEEK read."""
    if _TCP_INFO is not None:
        try:
            return sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 1) != _ESTABLISHED
        except OSError:
            return True
    try:
        sock.recv(1, _PEEK_FLAGS)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True
