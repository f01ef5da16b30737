"""Worker health as the router sees it: active-probe thresholds plus a circuit breaker.

Active probes decide ``healthy`` (``healthy_after`` successes / ``unhealthy_after`` failures in a
row). Passive signals (a 5xx or a transport failure on a real request) feed the breaker: after
``breaker_failures`` in a row it opens, the worker gets no traffic for ``breaker_open_s``, then
half-opens and the next probe decides. A client's 4xx is never reported here.
"""

from __future__ import annotations

import time
from enum import StrEnum


class Breaker(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class HealthState:
    __slots__ = (
        "breaker",
        "breaker_failures",
        "breaker_open_s",
        "consecutive_failures",
        "healthy",
        "healthy_after",
        "last_error",
        "last_probe_at",
        "opened_at",
        "probe_failures",
        "probe_successes",
        "transitions",
        "unhealthy_after",
    )

    def __init__(
        self, healthy_after: int, unhealthy_after: int, breaker_failures: int, breaker_open_s: float
    ) -> None:
        self.healthy_after = healthy_after
        self.unhealthy_after = unhealthy_after
        self.breaker_failures = breaker_failures
        self.breaker_open_s = breaker_open_s
        self.healthy = True  # optimistic until probes say otherwise: a new worker gets traffic
        self.probe_successes = 0
        self.probe_failures = 0
        self.consecutive_failures = 0  # passive: 5xx and transport failures in a row
        self.breaker = Breaker.CLOSED
        self.opened_at = 0.0
        self.last_probe_at = 0.0
        self.last_error = ""
        self.transitions = 0

    @property
    def admits(self) -> bool:
        """May new requests go to this worker?"""
        if not self.healthy:
            return False
        if self.breaker is Breaker.OPEN:
            if time.monotonic() - self.opened_at < self.breaker_open_s:
                return False
            self.breaker = Breaker.HALF_OPEN  # the next probe decides; no traffic until then
        return self.breaker is Breaker.CLOSED

    def probe_result(self, ok: bool, error: str = "") -> bool:
        """Record one active probe. Returns True when ``healthy`` changed."""
        self.last_probe_at = time.monotonic()
        before = self.healthy
        if ok:
            self.probe_failures = 0
            self.probe_successes += 1
            if self.probe_successes >= self.healthy_after:
                self.healthy = True
            if self.breaker is not Breaker.CLOSED and (
                self.breaker is Breaker.HALF_OPEN
                or time.monotonic() - self.opened_at >= self.breaker_open_s
            ):
                self.breaker = Breaker.CLOSED
                self.consecutive_failures = 0
        else:
            self.last_error = error
            self.probe_successes = 0
            self.probe_failures += 1
            if self.probe_failures >= self.unhealthy_after:
                self.healthy = False
            if self.breaker is Breaker.HALF_OPEN:
                self._open()
        if before != self.healthy:
            self.transitions += 1
            return True
        return False

    def request_succeeded(self) -> None:
        self.consecutive_failures = 0

    def request_failed(self, error: str) -> None:
        """A 5xx or transport failure on a real request."""
        self.last_error = error
        self.consecutive_failures += 1
        if self.consecutive_failures >= self.breaker_failures and self.breaker is Breaker.CLOSED:
            self._open()

    def _open(self) -> None:
        self.breaker = Breaker.OPEN
        self.opened_at = time.monotonic()
        self.transitions += 1

    def describe(self) -> dict:
        return {
            "healthy": self.healthy,
            "breaker": self.breaker.value,
            "probe_successes": self.probe_successes,
            "probe_failures": self.probe_failures,
            "consecutive_failures": self.consecutive_failures,
            "last_error": self.last_error,
        }
