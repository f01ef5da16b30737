"""Realtime counters on the worker's Prometheus registry, with fixed label vocabularies: error
events by code, and sessions ended by close code (``client``: the client closed first)."""

from __future__ import annotations

from prometheus_client import Counter

from worker.api.realtime.errors import Close, Code
from worker.service import WorkerService

CLIENT_CLOSED = "client"
OTHER = "other"


class RealtimeMetrics:
    def __init__(self, registry) -> None:
        self.errors = Counter(
            "omni_worker_realtime_errors",
            "realtime error events sent, by code",
            ["code"],
            registry=registry,
        )
        self.closes = Counter(
            "omni_worker_realtime_closes",
            "realtime sessions ended, by close code (client: the client closed)",
            ["code"],
            registry=registry,
        )
        self._codes = frozenset(c.value for c in Code)
        for code in (*self._codes, OTHER):
            self.errors.labels(code)
        for close in (*(str(c.value) for c in Close), CLIENT_CLOSED):
            self.closes.labels(close)

    def error(self, code: str) -> None:
        self.errors.labels(code if code in self._codes else OTHER).inc()

    def closed(self, code: Close | None) -> None:
        self.closes.labels(CLIENT_CLOSED if code is None else str(code.value)).inc()


def realtime_metrics(service: WorkerService) -> RealtimeMetrics:
    """The service's realtime counters, registered once per metrics registry."""
    found = getattr(service.metrics, "realtime", None)
    if found is None:
        found = RealtimeMetrics(service.metrics.registry)
        service.metrics.realtime = found  # type: ignore[attr-defined]
    return found
