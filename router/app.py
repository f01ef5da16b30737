"""The router: its parts, built from the settings and wired together, and its life (serve,
background tasks, graceful stop). The request path is router.request_path; the router's own
endpoints are router.admin."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
from collections.abc import Coroutine
from typing import Any

from fleet.settings import redacted_url
from router.admin import Admin
from router.admission import Admission
from router.affinity import Affinity
from router.auth import ClientAuth
from router.discovery import Discovery
from router.http.server import ClientConnection
from router.metrics import Metrics
from router.probes import Prober
from router.request_path import RequestPath
from router.resources import connection_cap, raise_fd_limit
from router.scaling import Scaler
from router.settings import RouterSettings
from router.view import FleetView

log = logging.getLogger("omni.router")


class Router:
    def __init__(self, settings: RouterSettings) -> None:
        self.settings = settings
        self.view = FleetView(settings)
        self.view.add_static(settings.worker)
        self.metrics = Metrics()
        per_process = -(-settings.max_in_flight // settings.processes)
        admission = Admission(self.view, per_process, settings.retry_after_s)
        token = settings.worker_token
        worker_token_line = (
            b"x-omni-worker-token: " + token.get_secret_value().encode() + b"\r\n" if token else b""
        )
        self.prober = Prober(settings, self.view, self.metrics, worker_token_line)
        self.discovery = (
            Discovery(settings, self.view, self.metrics) if settings.redis_url else None
        )
        self.auth = ClientAuth(settings.api_key, self.metrics)
        self.policy_name = settings.policy.value
        self.tasks: set[asyncio.Task] = set()
        self.started_at = time.time()
        self.stopping = False
        self.admin = Admin(self)
        self.requests = RequestPath(
            settings,
            self.view,
            self.metrics,
            admission,
            Affinity(settings, self.discovery),
            self.auth,
            self.prober,
            self.admin.handle,
            self.spawn,
            worker_token_line,
        )
        self.metrics.gauges = self.admin.gauges
        self.scaler = Scaler(settings, self.view)
        self.metrics.scale = lambda: self.scaler.signals

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def serve(self, ready: asyncio.Event | None = None) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        requests = self.requests
        requests.max_clients = connection_cap(s.max_connections, s.fd_reserve, raise_fd_limit())
        background = [requests.sweep(), self.prober.run()]
        if self.discovery is not None:
            background += [self.discovery.run(), self.scaler.run(self.discovery.store)]
        bg = [loop.create_task(c) for c in background]
        if self.discovery is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.discovery.synced.wait(), s.redis_timeout_s * 3)
        server = await loop.create_server(
            lambda: ClientConnection(requests),
            s.host,
            s.port,
            reuse_port=s.processes > 1 or None,
            backlog=4096,
        )
        log.info(
            "omni-router listening on %s:%d (pid %d, policy %s, redis %s, %d static workers)",
            s.host,
            s.port,
            os.getpid(),
            self.policy_name,
            "off" if self.discovery is None else redacted_url(self.discovery.url_for_humans),
            len(s.worker),
        )
        # Start-up objects (modules, settings, pydantic models) never die: keep them out of
        # every future collection, so that a full collection does not pause a stream.
        gc.collect()
        gc.freeze()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        if ready is not None:
            ready.set()
        await stop.wait()
        self.stopping = True
        server.close()
        deadline = time.monotonic() + s.shutdown_grace_s
        while requests.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if requests.tunnels:  # WebSocket sessions still open: a close code, not a cut
            requests.close_websockets()
            await asyncio.sleep(0.05)
        for task in bg + list(self.tasks):
            task.cancel()
        self.prober.close()
        for w in self.view.workers.values():
            if w.pool is not None:
                w.pool.close()
        if self.discovery is not None:
            await self.discovery.close()
        log.info("omni-router stopped")
