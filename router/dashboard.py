"""The live fleet page: ``GET /dashboard`` (one self-contained HTML page, no external assets)
and ``GET /dashboard/state`` (the JSON it polls about once a second).

The state is the router's ``/diagnostics`` plus what a person watching the fleet needs: each
worker's record details and its launch plan (sent once per plan digest: the page says which
digests it has with ``?have=``), this process's request counters and latency histogram (the
page turns them into rates and percentiles over a sliding window), error counts by code, and
session affinity (bindings per worker from Redis, moves). Everything comes from memory except
the affinity figures, which are read from Redis at most every ``_REDIS_EVERY_S`` seconds.
``/dashboard/state`` asks for an API key exactly when ``/diagnostics`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs

from redis.exceptions import RedisError

from router.auth import ClientAuth
from router.discovery import Discovery
from router.http.server import ClientConnection, Request
from router.http.wire import json_response, simple_response
from router.metrics import BUCKETS, Metrics
from router.view import FleetView

PAGE = Path(__file__).with_name("static") / "dashboard.html"
_REDIS_EVERY_S = 2.0
_BINDINGS_LIMIT = 10_000
_HIDDEN_ROUTES = frozenset({"admin"})  # the dashboard's own polling is not fleet traffic
_NO_STORE = b"cache-control: no-store\r\n"


class Dashboard:
    def __init__(
        self,
        auth: ClientAuth,
        view: FleetView,
        metrics: Metrics,
        discovery: Discovery | None,
        diagnostics: Callable[[], dict],
    ) -> None:
        self.auth = auth
        self.view = view
        self.metrics = metrics
        self.discovery = discovery
        self.diagnostics = diagnostics  # the router's /diagnostics document
        self._affinity: dict = {"bindings": None, "by_worker": {}, "capped": False, "moves": None}
        self._affinity_at = 0.0
        self._refreshing: asyncio.Task | None = None
        self._plans: dict[str, dict] = {}  # by digest: content-addressed, never stale

    def handle(self, client: ClientConnection, req: Request, path: bytes) -> bool:
        """A GET under ``/dashboard``: False if it names no page here (the caller's 404)."""
        if path in (b"/dashboard", b"/dashboard/"):
            page = PAGE.read_bytes()  # a page load is rare; an edited page shows at once
            client.respond(
                simple_response(
                    200, page, b"text/html; charset=utf-8", client.keep_alive, _NO_STORE
                ),
                200,
            )
        elif path == b"/dashboard/state":
            if not self.auth.accepts_request(req.headers):
                self.auth.refuse(client)
                return True
            query = req.url.partition(b"?")[2].decode("latin-1")
            have = set(",".join(parse_qs(query).get("have", [])).split(","))
            client.respond(json_response(self.state(have), 200, client.keep_alive), 200)
            self._refresh_affinity_soon()
        else:
            return False
        return True

    def state(self, have_plans: set[str]) -> dict:
        doc = self.diagnostics()
        plans: dict[str, dict] = {}
        by_worker = self._affinity["by_worker"]
        for w in doc["workers"]:
            state = self.view.workers.get(w["id"])
            if state is None:
                continue
            record = state.record
            w["node"] = record.node
            w["version"] = record.version
            w["started_at"] = record.started_at
            w["endpoints"] = [e.value for e in record.capabilities.endpoints]
            w["plan_digest"] = record.plan_digest
            w["bindings"] = by_worker.get(w["id"], 0)
            plan = self._plans.get(record.plan_digest)
            if plan is not None and record.plan_digest not in have_plans:
                plans[record.plan_digest] = plan
        m = self.metrics
        routes = [r for r in m.hist if r not in _HIDDEN_ROUTES]
        doc["plans"] = plans
        doc["metrics"] = {
            "routes": routes,
            "requests": {
                r: {cls: n for (route, cls), n in m.requests.items() if route == r} for r in routes
            },
            "errors": [
                {"route": route, "code": code, "count": n}
                for (route, code), n in m.errors.items()
                if n and route not in _HIDDEN_ROUTES
            ],
            "buckets": list(BUCKETS),
            "hist": {r: m.hist[r] for r in routes},
            "hist_sum": {r: m.hist_sum[r] for r in routes},
            "health_transitions": m.health_transitions,
            "redis_reconnects": m.redis_reconnects,
            "websocket_closes": [
                {"by": by, "code": code, "count": n} for (by, code), n in m.ws_closes.items() if n
            ],
        }
        doc["affinity"] = {
            "outcomes": dict(m.affinity),
            "bindings": self._affinity["bindings"],
            "bindings_capped": self._affinity["capped"],
            "moves": self._affinity["moves"],
            "age_s": round(time.monotonic() - self._affinity_at, 1) if self._affinity_at else None,
        }
        doc["now"] = time.time()
        return doc

    def _refresh_affinity_soon(self) -> None:
        """Bindings, moves and plans live in Redis: read them in the background, seldom, one
        at a time, so a dashboard never holds up the request path or hammers Redis."""
        disc = self.discovery
        if disc is None or not disc.up:
            return
        if self._refreshing is not None and not self._refreshing.done():
            return
        if time.monotonic() - self._affinity_at < _REDIS_EVERY_S:
            return
        self._refreshing = asyncio.get_running_loop().create_task(self._refresh_affinity())

    async def _refresh_affinity(self) -> None:
        disc = self.discovery
        assert disc is not None
        with contextlib.suppress(RedisError, OSError, TimeoutError):
            by_worker, counted = await disc.store.session_bindings(_BINDINGS_LIMIT)
            moves = await disc.store.affinity_moves()
            digests = {w.record.plan_digest for w in self.view.workers.values()}
            missing = sorted(d for d in digests if d and d not in self._plans)
            self._plans.update(await disc.store.plans(missing))
            self._affinity = {
                "bindings": counted,
                "by_worker": by_worker,
                "capped": counted >= _BINDINGS_LIMIT,
                "moves": moves,
            }
        self._affinity_at = time.monotonic()
