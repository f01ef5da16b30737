"""The worker's entry in the fleet: record, heartbeat with TTL, load reports, events.

Redis being unreachable never stops the worker from serving: every write here is best
effort, and once Redis answers again the record is rewritten and the worker announces
itself again (a restarted Redis comes back empty).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import redis.exceptions

from fleet.records import EventKind, WorkerRecord, WorkerStatus
from fleet.store import FleetStore
from worker.service import WorkerService

log = logging.getLogger(__name__)

_REDIS_ERRORS = (redis.exceptions.RedisError, OSError, asyncio.TimeoutError)

EVENT_OF_STATUS = {
    WorkerStatus.STARTING: EventKind.JOINED,
    WorkerStatus.READY: EventKind.READY,
    WorkerStatus.DRAINING: EventKind.DRAINING,
    WorkerStatus.UNHEALTHY: EventKind.UNHEALTHY,
}


class Registrar:
    def __init__(
        self,
        store: FleetStore,
        record: WorkerRecord,
        service: WorkerService,
        *,
        heartbeat_interval: float,
        ttl: float,
        load_interval: float,
    ) -> None:
        self.store = store
        self.record = record
        self.service = service
        self.heartbeat_interval = heartbeat_interval
        self.ttl_ms = int(ttl * 1000)
        self.load_interval = load_interval
        self.redis_up: bool | None = None  # None: not tried yet
        self._stale = True  # the record in Redis (if any) is not the current one
        self._tasks: list[asyncio.Task] = []
        self._lock = asyncio.Lock()

    def _went_down(self, exc: BaseException) -> None:
        self._stale = True
        if self.redis_up is not False:
            log.warning("Redis unreachable (%s); still serving, will re-register", exc)
        self.redis_up = False
        self.service.metrics.redis_up.set(0)

    def _came_up(self) -> None:
        if self.redis_up is not True:
            log.info("registered in Redis as %s (%s)", self.record.id, self.record.status.value)
        self.redis_up = True
        self.service.metrics.redis_up.set(1)

    async def _announce(self, detail: str) -> None:
        """Rewrite the record and publish its status; a (re)joining worker says "joined" first
        so that routers learn of it before they learn its status."""
        if self._stale and self.record.status != WorkerStatus.STARTING:
            await self.store.publish_event(EventKind.JOINED, self.record.id, "re-registered")
        await self.store.write_record(self.record, self.ttl_ms)
        await self.store.publish_event(EVENT_OF_STATUS[self.record.status], self.record.id, detail)
        self._stale = False

    async def set_status(self, status: WorkerStatus, detail: str = "") -> None:
        """Record and announce a status change now (best effort)."""
        async with self._lock:
            self.record.status = status
            try:
                await self._announce(detail)
                self._came_up()
            except _REDIS_ERRORS as exc:
                self._went_down(exc)

    async def heartbeat_once(self) -> None:
        async with self._lock:
            try:
                if self._stale:
                    await self._announce("re-registered")
                elif not await self.store.heartbeat(self.record, self.ttl_ms):
                    # The record was gone (TTL ran out, or Redis restarted empty): heartbeat()
                    # rewrote it; announce again so routers pick the worker up at once.
                    log.warning("record was missing in Redis; re-registered")
                    await self.store.publish_event(
                        EventKind.JOINED, self.record.id, "re-registered"
                    )
                    await self.store.publish_event(
                        EVENT_OF_STATUS[self.record.status], self.record.id, "re-registered"
                    )
                self._came_up()
            except _REDIS_ERRORS as exc:
                self._went_down(exc)

    async def _heartbeats(self) -> None:
        while True:
            await self.heartbeat_once()
            await asyncio.sleep(self.heartbeat_interval)

    async def _loads(self) -> None:
        while True:
            report = self.service.load_report()
            if self.redis_up:
                try:
                    await self.store.publish_load(report, self.ttl_ms)
                except _REDIS_ERRORS as exc:
                    self._went_down(exc)
            await asyncio.sleep(self.load_interval)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._heartbeats(), name="heartbeat"),
            asyncio.create_task(self._loads(), name="load-report"),
        ]

    async def stop(self) -> None:
        # A cancellation that lands inside a redis-py command can be swallowed there (seen with
        # redis-py 8.1: the task goes on to its next sleep, still "cancelling"); cancel again
        # until the task is really done, or a stopping worker waits on it forever.
        pending = set(self._tasks)
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.2)
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    async def deregister(self) -> None:
        """Remove the record and load, publish ``left`` (best effort)."""
        await self.stop()
        try:
            await asyncio.wait_for(self.store.deregister(self.record.id), timeout=5)
            log.info("deregistered %s", self.record.id)
        except _REDIS_ERRORS as exc:
            log.warning("could not deregister (%s); the record expires with its TTL", exc)
