"""Active health probes (``GET /health`` on every worker) and on-demand probes after a
transport failure."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from router.http.client import http_get
from router.metrics import Metrics
from router.resources import is_exhaustion
from router.settings import RouterSettings
from router.view import FleetView, WorkerState

log = logging.getLogger("omni.router.health")
_SOON_MIN_GAP_S = 0.1  # passive signals probe at most this often per worker


class Prober:
    def __init__(
        self, settings: RouterSettings, view: FleetView, metrics: Metrics, auth_headers: bytes
    ) -> None:
        self.settings = settings
        self.view = view
        self.metrics = metrics
        self.auth_headers = auth_headers
        self._pending: set[str] = set()
        self._tasks: set[asyncio.Task] = set()

    async def run(self) -> None:
        while True:
            workers = list(self.view.workers.values())
            if workers:
                await asyncio.gather(*(self.probe(w) for w in workers), return_exceptions=True)
            await asyncio.sleep(self.settings.probe_interval_s)

    def probe_soon(self, worker: WorkerState) -> None:
        """A transport failure: probe now instead of at the next round."""
        if worker.id in self._pending:
            return
        if time.monotonic() - worker.health.last_probe_at < _SOON_MIN_GAP_S:
            return
        self._pending.add(worker.id)
        task = asyncio.get_running_loop().create_task(self._probe_once(worker))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _probe_once(self, worker: WorkerState) -> None:
        try:
            await self.probe(worker)
        finally:
            self._pending.discard(worker.id)

    async def probe(self, worker: WorkerState) -> None:
        timeout = self.settings.probe_timeout_s
        try:
            status, _ = await http_get(
                worker.host, worker.port, "/health", timeout, self.auth_headers
            )
            ok, error = status == 200, f"/health answered HTTP {status}"
        except (OSError, TimeoutError) as exc:
            if is_exhaustion(exc):
                # the router could not open a socket: that says nothing about the worker
                self.metrics.resource_errors += 1
                log.warning("probe of %s skipped: router out of resources (%s)", worker.id, exc)
                return
            ok, error = False, f"/health: {type(exc).__name__}: {exc}"
        if self.view.workers.get(worker.id) is not worker:
            return  # removed while probing
        health = worker.health
        before = (health.healthy, health.breaker)
        changed = health.probe_result(ok, "" if ok else error)
        if (health.healthy, health.breaker) != before:
            self.view.version += 1
        if changed:
            self.metrics.health_transitions += 1
            log.warning(
                "worker %s is now %s%s",
                worker.id,
                "healthy" if health.healthy else "unhealthy",
                "" if ok else f" ({error})",
            )
        if not ok:
            self.metrics.probes_failed += 1

    def close(self) -> None:
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                task.cancel()
