"""The router's in-memory view of the fleet: what the request path reads, without Redis."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from fleet.records import (
    Capabilities,
    Endpoint,
    LoadReport,
    Modality,
    WorkerRecord,
    WorkerStatus,
)
from router.health import HealthState
from router.http.pool import Pool
from router.settings import RouterSettings

_ALL_CAPABILITIES = Capabilities(
    endpoints=list(Endpoint), input_modalities=list(Modality), output_modalities=list(Modality)
)
# a load report older than this no longer says anything about the worker's queues
LOAD_STALE_S = 5.0


class WorkerState:
    """One worker: its record, its latest load report, the router's own counts and pool."""

    __slots__ = (
        "capacity",
        "endpoints",
        "errors",
        "gone",
        "health",
        "host",
        "host_line",
        "id",
        "id_line",
        "in_flight",
        "input_modalities",
        "last_picked",
        "latency",
        "load",
        "load_at",
        "models",
        "output_modalities",
        "pool",
        "port",
        "prefix",
        "record",
        "report_waiters",
        "requests",
        "static",
        "streaming",
        "url",
        "ws_sessions",
    )
    record: WorkerRecord

    def __init__(self, record: WorkerRecord, settings: RouterSettings, static: bool) -> None:
        self.id = record.id
        self.id_line = b"x-omni-worker-id: " + record.id.encode() + b"\r\n"
        self.static = static
        self.health = HealthState(
            settings.healthy_after,
            settings.unhealthy_after,
            settings.breaker_failures,
            settings.breaker_open_s,
        )
        self.in_flight = 0  # this process's requests on the worker now
        self.requests = 0
        self.ws_sessions = 0  # this process's WebSocket sessions on the worker (in in_flight too)
        self.errors = 0
        self.gone = False  # left the fleet (its record expired or it deregistered)
        self.last_picked = 0  # recency order for round_robin
        self.latency = 0.0  # moving average of request duration (s), a tie-breaker for `load`
        self.load: LoadReport | None = None
        self.load_at = 0.0
        self.report_waiters: list[asyncio.Future[None]] = []  # see next_report()
        self.pool: Pool | None = None
        self.url = ""
        # what the cache-aware policy has sent here (router.prefix); dropped through
        # FleetView.cache_lost when the worker restarts or leaves
        self.prefix: WorkerPrefixes | None = None
        self.update_record(record, settings)

    def update_record(self, record: WorkerRecord, settings: RouterSettings) -> None:
        self.record = record
        if record.url.rstrip("/") != self.url:
            parts = urlsplit(record.url)
            self.url = record.url.rstrip("/")
            self.host = parts.hostname or "127.0.0.1"
            self.port = parts.port or 80
            self.host_line = f"host: {parts.netloc}\r\n".encode()
            if self.pool is not None:
                self.pool.close()
            self.pool = Pool(self.host, self.port, settings.pool_max_idle)
        self.capacity = record.capacity
        caps = record.capabilities
        self.endpoints = frozenset(caps.endpoints)
        self.input_modalities = frozenset(caps.input_modalities)
        self.output_modalities = frozenset(caps.output_modalities)
        self.streaming = caps.streaming
        # None: serves whatever model is asked for (static workers)
        self.models = None if self.static else frozenset(record.served_models)

    def update_load(self, report: LoadReport) -> None:
        current = self.load
        if current is not None and report.at < current.at and self.fresh_load() is not None:
            return  # a resync read an older report than the one published since
        self.load = report
        self.load_at = time.monotonic()
        waiters, self.report_waiters = self.report_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def report_after(self, at: float, timeout_s: float) -> bool:
        """Wait for a load report the worker made after ``at`` (wall clock, as reports are
        stamped); False if none came within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.load is None or self.load.at <= at:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            waiter = asyncio.get_running_loop().create_future()
            self.report_waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                return False
        return True

    def fresh_load(self) -> LoadReport | None:
        if self.load is not None and time.monotonic() - self.load_at < LOAD_STALE_S:
            return self.load
        return None

    @property
    def routable(self) -> bool:
        """Ready, healthy, not draining, breaker closed (capability checks come per request)."""
        if self.record.status is not WorkerStatus.READY:
            return False
        load = self.load
        if load is not None and not load.healthy:
            return False
        return self.health.admits

    def has_capacity(self) -> bool:
        if self.in_flight >= self.capacity:
            return False
        load = self.fresh_load()
        return load is None or load.in_flight < self.capacity or self.in_flight == 0

    def describe(self) -> dict:
        load = self.load
        return {
            "id": self.id,
            "url": self.url,
            "static": self.static,
            "model": self.record.model,
            "served_models": self.record.served_models,
            "status": self.record.status.value,
            "routable": self.routable,
            "capacity": self.capacity,
            "in_flight": self.in_flight,
            "requests": self.requests,
            "websocket_sessions": self.ws_sessions,
            "errors": self.errors,
            "health": self.health.describe(),
            "load": None if load is None else load.model_dump(mode="json"),
            "load_age_s": None if load is None else round(time.monotonic() - self.load_at, 3),
            "pool_idle": 0 if self.pool is None else self.pool.idle_count(),
        }


class WorkerPrefixes:
    """What this router has sent to one worker, as far as its prefix cache can hold it: the
    cache-aware policy's record (router.prefix), on the worker's state (``prefix``) until the
    worker restarts or leaves."""

    __slots__ = ("bit", "blocks", "budget", "hits", "placed", "tokens", "worker")

    def __init__(self, worker: WorkerState, bit: int, budget: int) -> None:
        self.worker = worker
        self.bit = bit
        self.budget = budget  # estimated tokens its cache holds
        self.blocks: OrderedDict[int, int] = OrderedDict()  # hash -> tokens, oldest first
        self.tokens = 0
        self.placed = 0  # text chats sent here since the record began
        self.hits = 0  # of which the record held the start (the engine had part of it cached)


def static_record(url: str, capacity: int) -> WorkerRecord:
    parts = urlsplit(url)
    return WorkerRecord(
        id=f"{parts.hostname}:{parts.port}",
        url=url,
        node=parts.hostname or "",
        model="*",
        served_models=[],
        capabilities=_ALL_CAPABILITIES,
        capacity=capacity,
        status=WorkerStatus.READY,
    )


def _nothing(worker: WorkerState) -> None:
    pass


class FleetView:
    """Worker id -> state. ``version`` changes whenever membership or routability may have."""

    def __init__(self, settings: RouterSettings) -> None:
        self.settings = settings
        self.workers: dict[str, WorkerState] = {}
        self.version = 0
        # the prefix caches of all workers, in tokens: above 0, the cache-aware policy hashes
        # prompts (kept as workers come and go, so that the request path reads one attribute)
        self.prefix_cache_tokens = 0
        # called when a worker's prefix cache is gone (it restarted: another ``started_at``, or
        # it left the fleet), so that nothing is sent there for a prefix it no longer holds
        self.cache_lost: Callable[[WorkerState], None] = _nothing

    def add_static(self, urls: Iterable[str]) -> None:
        for url in urls:
            record = static_record(url, self.settings.static_capacity)
            self.workers[record.id] = WorkerState(record, self.settings, static=True)
            self.prefix_cache_tokens += self.settings.static_prefix_cache_tokens
        self.version += 1

    def upsert(self, record: WorkerRecord) -> WorkerState:
        state = self.workers.get(record.id)
        if state is None:
            state = WorkerState(record, self.settings, static=False)
            self.workers[record.id] = state
        else:
            self.prefix_cache_tokens -= state.record.prefix_cache_tokens
            if state.prefix is not None and record.started_at != state.record.started_at:
                self.cache_lost(state)
            state.update_record(record, self.settings)
        self.prefix_cache_tokens += record.prefix_cache_tokens
        self.version += 1
        return state

    def remove(self, worker_id: str) -> None:
        state = self.workers.get(worker_id)
        if state is not None and not state.static:
            self.prefix_cache_tokens -= state.record.prefix_cache_tokens
            if state.prefix is not None:
                self.cache_lost(state)
            del self.workers[worker_id]
            state.gone = True  # its streams still open fail over (RequestPath.sweep)
            if state.pool is not None:
                state.pool.close()
            self.version += 1

    def dynamic_ids(self) -> set[str]:
        return {wid for wid, w in self.workers.items() if not w.static}

    def known_models(self) -> set[str] | None:
        """Every model some worker serves; None if a static worker serves anything."""
        models: set[str] = set()
        for w in self.workers.values():
            if w.models is None:
                return None
            models |= w.models
        return models
