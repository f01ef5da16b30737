"""The router's own endpoints: /live, /ready, /metrics, /diagnostics, /v1/models (merged over
the fleet) and the dashboard's routes; readiness, diagnostics and the gauges behind them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Coroutine
from typing import Any, Protocol
from urllib.parse import unquote

import orjson

from fleet.errors import ErrorCode, OmniError
from fleet.records import Endpoint, Modality
from router.auth import ClientAuth
from router.dashboard import Dashboard
from router.discovery import Discovery
from router.http.client import http_get
from router.http.server import ClientConnection, Request
from router.http.wire import json_response, simple_response
from router.metrics import Metrics
from router.request_path import RequestPath
from router.scaling import Scaler
from router.settings import RouterSettings
from router.view import FleetView

_ENDPOINTS = [e.value for e in Endpoint]
_MODALITIES = [m.value for m in Modality]


class _FleetModel:
    """One model id as the fleet serves it: the union of what its workers advertise (a
    rolling upgrade may briefly mix two builds), in the fixed vocabularies' order."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.created: int | None = None
        self.endpoints: set[str] = set()
        self.inputs: set[str] = set()
        self.outputs: set[str] = set()
        self.streaming = False
        self.voices: dict[str, None] = {}  # ordered as the first worker lists them

    def add(self, created: object, caps: object, voices: object) -> None:
        if isinstance(created, int) and (self.created is None or created < self.created):
            self.created = created
        if isinstance(caps, dict):
            self.endpoints.update(caps.get("endpoints") or ())
            self.inputs.update(caps.get("input_modalities") or ())
            self.outputs.update(caps.get("output_modalities") or ())
            self.streaming = self.streaming or caps.get("streaming") is True
        if isinstance(voices, list):
            self.voices.update(dict.fromkeys(str(v) for v in voices))

    def json(self) -> dict:
        return {
            "id": self.name,
            "object": "model",
            "created": self.created or 0,
            "owned_by": "omni-fleet",
            "capabilities": {
                "endpoints": [e for e in _ENDPOINTS if e in self.endpoints],
                "input_modalities": [m for m in _MODALITIES if m in self.inputs],
                "output_modalities": [m for m in _MODALITIES if m in self.outputs],
                "streaming": self.streaming,
            },
            "voices": list(self.voices),
        }


class RouterParts(Protocol):
    """What the admin endpoints read of the router (router.app.Router)."""

    settings: RouterSettings
    view: FleetView
    metrics: Metrics
    auth: ClientAuth
    discovery: Discovery | None
    requests: RequestPath
    scaler: Scaler
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
        elif path == b"/diagnostics" or path == b"/v1/models" or path.startswith(b"/v1/models/"):
            if not self.router.auth.accepts_request(req.headers):
                self.router.auth.refuse(client)
                return
            if path == b"/diagnostics":
                client.respond(json_response(self.diagnostics(), 200, client.keep_alive), 200)
            else:
                self.router.spawn(self.models(client, path))
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
        prefixes = self.router.requests.prefixes
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
                "prefix_bound": s.prefix_bound,
                "prefix_slack": s.prefix_slack,
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
            "workers": [
                {**w.describe(), "prefix": prefixes.describe(w)}
                for w in self.router.view.workers.values()
            ],
            # per model: the workers it needs (router/scaling.py; empty without Redis)
            "scaling": [s.model_dump(mode="json") for s in self.router.scaler.signals],
            "counts": {
                "policy": self.router.metrics.policy_outcomes(),
                "affinity": dict(self.router.metrics.affinity),
                "prefix": {o.value: n for o, n in self.router.metrics.prefix_outcomes().items()},
            },
        }

    async def models(self, client: ClientConnection, path: bytes) -> None:
        """/v1/models (or /v1/models/{id}): every model the fleet serves, each with what its
        workers say of it (capabilities and built-in voices), merged over those workers."""
        merged: dict[str, _FleetModel] = {}
        static = []
        for w in self.router.view.workers.values():
            if w.static:
                static.append(w)
            elif w.record.status.value in ("ready", "draining"):
                r = w.record
                for name in r.served_models:
                    merged.setdefault(name, _FleetModel(name)).add(
                        int(r.started_at), r.capabilities.model_dump(mode="json"), r.voices
                    )
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
                        name = str(item["id"])
                        merged.setdefault(name, _FleetModel(name)).add(
                            item.get("created"), item.get("capabilities"), item.get("voices")
                        )
        if path == b"/v1/models":
            doc = {"object": "list", "data": [m.json() for m in merged.values()]}
        else:
            name = unquote(path[len(b"/v1/models/") :].decode("latin-1"))
            if name not in merged:
                self.router.requests.fail(
                    client,
                    OmniError(
                        404, ErrorCode.MODEL_NOT_FOUND, f"no worker serves model {name!r}", "model"
                    ),
                )
                return
            doc = merged[name].json()
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
            **self.router.requests.prefixes.gauges(),
        }
