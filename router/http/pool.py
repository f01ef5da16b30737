"""Keep-alive connections to one worker: a LIFO stack of idle upstream connections."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.http.proxy import Upstream


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

    async def connect(self, factory: Callable[[Pool], Upstream], timeout_s: float) -> Upstream:
        """A new connection whose relay ``factory`` makes (``Upstream``, or a replay's)."""
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
