"""The label vocabularies of the worker's realtime counters (``WorkerMetrics.realtime_*``):
error events by code, and sessions ended by close code (``client``: the client closed first)."""

from __future__ import annotations

from worker.api.realtime.errors import Close, Code
from worker.metrics import WorkerMetrics

CLIENT_CLOSED = "client"
OTHER = "other"
_CODES = frozenset(c.value for c in Code)


class RealtimeMetrics:
    def __init__(self, metrics: WorkerMetrics) -> None:
        self.errors = metrics.realtime_errors
        self.closes = metrics.realtime_closes

    def export_at_zero(self) -> None:
        """Every label of the vocabulary from the worker's start, so dashboards see zeros."""
        for code in (*_CODES, OTHER):
            self.errors.labels(code)
        for close in (*(str(c.value) for c in Close), CLIENT_CLOSED):
            self.closes.labels(close)

    def error(self, code: str) -> None:
        self.errors.labels(code if code in _CODES else OTHER).inc()

    def closed(self, code: Close | None) -> None:
        self.closes.labels(CLIENT_CLOSED if code is None else str(code.value)).inc()
