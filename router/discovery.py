"""Fleet discovery from Redis: events and load reports by pub/sub, plus a periodic resync.

The resync is the source of truth (it also notices records whose heartbeat TTL ran out); the
pub/sub feed makes changes visible at once. When Redis goes away the view is kept as it was and
``up`` turns False; both loops reconnect on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from urllib.parse import urlsplit

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from fleet.records import EventKind, FleetEvent, LoadReport, WorkerRecord
from fleet.settings import redacted_url
from fleet.store import FleetStore, connect
from router.metrics import Metrics
from router.settings import RouterSettings
from router.view import FleetView

log = logging.getLogger("omni.router.discovery")
_ERRORS = (RedisError, OSError, asyncio.TimeoutError, ValidationError)
# Cloud instance-metadata endpoints: a record pointing there would turn the router into a proxy
# for credentials. Link-local addresses (169.254.0.0/16, fe80::/10) are refused as a whole.
_METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata.goog", "metadata"})
_METADATA_IPS = (ipaddress.ip_network("fd00:ec2::254/128"),)
# A Redis that comes back (restarted, failed over) may be empty until every live worker has
# re-registered at its next heartbeat: records missing then are not taken as departures.
RECONNECT_GRACE_S = 5.0


def url_refusal(url: str) -> str | None:
    """Why requests must not be forwarded to a worker record's URL (None: it is admitted)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        return f"malformed URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return f"scheme {parts.scheme!r} is not http or https"
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        return "no host"
    if host in _METADATA_HOSTS:
        return "a cloud metadata address"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None  # a name: resolved when connecting
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        ip = mapped
    if ip.is_link_local or any(ip in net for net in _METADATA_IPS):
        return "a link-local or metadata address"
    if ip.is_multicast or ip.is_unspecified:
        return "not a unicast address"
    return None


class Discovery:
    def __init__(self, settings: RouterSettings, view: FleetView, metrics: Metrics) -> None:
        assert settings.redis_url is not None
        url = settings.redis_url.get_secret_value()
        self.url_for_humans = redacted_url(url)
        self.settings = settings
        self.view = view
        self.metrics = metrics
        client = connect(url, timeout_s=settings.redis_timeout_s)
        # a pooled connection that died with a Redis restart is retried once on a fresh one,
        # instead of failing the request path that happened to pick it (a cluster client has
        # no single pool: it retries on its own, on the node that now holds the slot)
        if isinstance(client, Redis):
            client.connection_pool.connection_kwargs.update(
                retry=Retry(NoBackoff(), 1), retry_on_error=[RedisConnectionError]
            )
        self.store = FleetStore(client, settings.fleet)
        self.up = False
        self.last_sync = 0.0  # monotonic time of the last successful resync
        self.last_error = ""
        self.synced = asyncio.Event()
        self._refused: dict[str, str] = {}  # worker id -> refused URL (logged once)
        self._grace_until = 0.0  # monotonic: keep workers whose records are missing until then

    def _admissible(self, record: WorkerRecord) -> bool:
        reason = url_refusal(record.url)
        if reason is None:
            self._refused.pop(record.id, None)
            return True
        if self._refused.get(record.id) != record.url:
            self._refused[record.id] = record.url
            log.warning("refusing worker %s: URL %r is %s", record.id, record.url, reason)
        self.view.remove(record.id)
        return False

    async def run(self) -> None:
        await asyncio.gather(self._resync_loop(), self._listen_loop())

    def mark_down(self, exc: BaseException) -> None:
        if self.up:
            log.warning(
                "Redis %s unreachable, routing on the last view: %s", self.url_for_humans, exc
            )
        self.up = False
        self.last_error = f"{type(exc).__name__}: {exc}"

    def _mark_up(self) -> None:
        if not self.up:
            if self.last_sync:
                self.metrics.redis_reconnects += 1
                self._grace_until = time.monotonic() + RECONNECT_GRACE_S
                log.warning("Redis %s reachable again", self.url_for_humans)
            self.up = True

    async def resync(self) -> None:
        views = await self.store.snapshot()
        now = time.monotonic()
        if not views and self.view.dynamic_ids() and now - self._grace_until > RECONNECT_GRACE_S:
            # every record gone at once: a Redis that restarted empty (workers that leave say
            # so with events); wait for the re-registrations before believing it
            self._grace_until = now + RECONNECT_GRACE_S
        seen = set()
        for worker_id, wv in views.items():
            if not self._admissible(wv.record):
                continue
            seen.add(worker_id)
            current = self.view.workers.get(worker_id)
            if current is None or current.record != wv.record:
                self.view.upsert(wv.record)
            if wv.load is not None:
                self._apply_load(wv.load)
        self._mark_up()
        if time.monotonic() >= self._grace_until:
            for worker_id in self.view.dynamic_ids() - seen:
                log.info("worker %s left (record gone)", worker_id)
                self.view.remove(worker_id)
        self.last_sync = time.monotonic()
        self.synced.set()

    async def _resync_loop(self) -> None:
        while True:
            try:
                await self.resync()
            except _ERRORS as exc:
                self.mark_down(exc)
            await asyncio.sleep(self.settings.resync_interval_s)

    async def _listen_loop(self) -> None:
        backoff = 0.1
        while True:
            try:
                async for item in self.store.listen():
                    backoff = 0.1
                    if isinstance(item, LoadReport):
                        self._apply_load(item)
                    else:
                        await self._apply_event(item)
            except _ERRORS as exc:
                self.mark_down(exc)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)
            try:  # catch up with whatever was published while we were away
                await self.resync()
            except _ERRORS as exc:
                self.mark_down(exc)

    def _apply_load(self, report: LoadReport) -> None:
        worker = self.view.workers.get(report.worker_id)
        if worker is None or worker.static:
            return
        was = worker.load.healthy if worker.load is not None else True
        worker.update_load(report)
        if report.healthy != was:
            self.view.version += 1

    async def _apply_event(self, event: FleetEvent) -> None:
        if event.kind is EventKind.LEFT:
            log.info("worker %s left", event.worker_id)
            self.view.remove(event.worker_id)
            return
        raw = await self.store.redis.get(self.store.keys.worker(event.worker_id))
        if raw is None:
            # a re-joining worker announces itself just before it rewrites its record; a
            # record that really expired is dropped by the resync
            return
        record = WorkerRecord.model_validate_json(raw)
        if not self._admissible(record):
            return
        log.info("worker %s: %s (status %s)", record.id, event.kind.value, record.status.value)
        self.view.upsert(record)

    async def close(self) -> None:
        with contextlib.suppress(*_ERRORS):
            await self.store.close()
