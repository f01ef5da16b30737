"""The router's own endpoints: /live, /ready, /metrics, /diagnostics, /v1/models (merged over
the fleet) and the dashboard's routes; readiness, diagnostics and the gauges behind them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Coroutine
from typing import Any, Protocol

import orjson

from fleet.errors import ErrorCode, OmniError
from router.auth import ClientAuth
from router.dashboard import Dashboard
from router.discovery import Discovery
from router.http.client import http_get
from router.http.server import ClientConnection, Request
from router.http.wire import json_response, simple_response
from router.metrics import Metrics
from router.request_path import RequestPath
from router.settings import RouterSettings
from router.view import FleetView


class RouterParts(Protocol):
    """What the admin endpoints read of the router (router.app.Router)."""

    settings: RouterSettings
    view: FleetView
    metrics: Metrics
    auth: ClientAuth
    discovery: Discovery | None
    requests: RequestPath
    policy_name: str
    started_at: float
    stopping: bool

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...


class Admin:
    def __init__(self, router: RouterParts) -> None:
        self.router = router
        self.dashboard = Dashboard(
            router.auth, router.view, router.metrics, router.discovery, self.diagnostics
        )

    def handle(self, client: ClientConnection, req: Request, path: bytes) -> None:
        if req.method != b"GET":
            self.router.requests.fail(client, OmniError(404, ErrorCode.NOT_FOUND, "not found"))
            return
        if path == b"/live":
            client.respond(json_response({"status": "live"}, keep_alive=client.keep_alive), 200)
        elif path == b"/ready":
            doc = self.readiness()
            status = 200 if doc["ready"] else 503
            client.respond(json_response(doc, status, client.keep_alive), status)
        elif path == b"/metrics":
            client.respond(
                simple_response(
                    200,
                    self.router.metrics.render(),
                    b"text/plain; version=0.0.4; charset=utf-8",
                    client.keep_alive,
                ),
                200,
            )
        elif path in (b"/diagnostics", b"/v1/models"):
            if not self.router.auth.accepts_request(req.headers):
                self.router.auth.refuse(client)
                return
            if path == b"/diagnostics":
                client.respond(json_response(self.diagnostics(), 200, client.keep_alive), 200)
            else:
                self.router.spawn(self.models(client))
        elif (path == b"/dashboard" or path.startswith(b"/dashboard/")) and self.dashboard.handle(
            client, req, path
        ):
            pass
        else:
            self.router.requests.fail(
                client, OmniError(404, ErrorCode.NOT_FOUND, f"no route {path.decode()!r}")
            )

    def readiness(self) -> dict:
        routable = sum(1 for w in self.router.view.workers.values() if w.routable)
        redis = self.redis_state()
        ready = routable > 0 and not self.router.stopping
        detail = (
            "" if ready else ("shutting down" if self.router.stopping else "no routable worker")
        )
        if redis == "unreachable":
            detail = "Redis unreachable: routing on the last known fleet view"
        return {
            "ready": ready,
            "routable_workers": routable,
            "workers": len(self.router.view.workers),
            "redis": redis,
            "detail": detail,
        }

    def redis_state(self) -> str:
        if self.router.discovery is None:
            return "disabled"
        return "ok" if self.router.discovery.up else "unreachable"

    def diagnostics(self) -> dict:
        s = self.router.settings
        disc = self.router.discovery
        return {
            "router": {
                "pid": os.getpid(),
                "policy": self.router.policy_name,
                "processes": s.processes,
                "listen": f"{s.host}:{s.port}",
                "uptime_s": round(time.time() - self.router.started_at, 3),
                "in_flight": self.router.requests.in_flight,
                "in_flight_limit": self.router.requests.admission.max_in_flight,
                "websocket_sessions": self.router.requests.ws_sessions,
                "session_header": s.session_header,
                "affinity_bound": s.affinity_bound,
                "api_keys": len(s.api_key),
                "worker_token": s.worker_token is not None,
            },
            "redis": {
                "state": self.redis_state(),
                "url": None if disc is None else disc.url_for_humans,
                "fleet": s.fleet,
                "last_sync_age_s": None
                if disc is None or not disc.last_sync
                else round(time.monotonic() - disc.last_sync, 3),
                "last_error": None if disc is None else disc.last_error,
            },
            "workers": [w.describe() for w in self.router.view.workers.values()],
            "counts": {
                "policy": dict(self.router.metrics.policy),
                "affinity": dict(self.router.metrics.affinity),
            },
        }

    async def models(self, client: ClientConnection) -> None:
        ids: dict[str, None] = {}
        static = []
        for w in self.router.view.workers.values():
            if w.static:
                static.append(w)
            elif w.record.status.value in ("ready", "draining"):
                ids.update(dict.fromkeys(w.record.served_models))
        results = await asyncio.gather(
            *(
                http_get(
                    w.host,
                    w.port,
                    "/v1/models",
                    self.router.settings.probe_timeout_s,
                    self.router.requests.worker_token_line,
                )
                for w in static
            ),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, tuple) and result[0] == 200:
                with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError):
                    for item in orjson.loads(result[1]).get("data", []):
                        ids[str(item["id"])] = None
        doc = {
            "object": "list",
            "data": [
                {"id": i, "object": "model", "created": 0, "owned_by": "omni-fleet"} for i in ids
            ],
        }
        client.respond(json_response(doc, 200, client.keep_alive), 200)

    def gauges(self) -> dict[str, float]:
        workers = list(self.router.view.workers.values())
        return {
            "in_flight": self.router.requests.in_flight,
            "websocket_sessions": self.router.requests.ws_sessions,
            "workers": len(workers),
            "workers_routable": sum(1 for w in workers if w.routable),
            "workers_draining": sum(1 for w in workers if w.record.status.value == "draining"),
            "workers_circuit_open": sum(1 for w in workers if w.health.breaker.value != "closed"),
            "redis_up": 1 if self.router.discovery is not None and self.router.discovery.up else 0,
            "client_connections": len(self.router.requests.clients),
            "client_connections_limit": self.router.requests.max_clients,
        }
