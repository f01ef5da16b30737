"""Refusals of hostile traffic, logged as a summary: the first one of a kind at once, then one
line per interval with the counts, so a client sending thousands of malformed requests costs
the log a line a minute instead of a line each."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

log = logging.getLogger("omni.worker.http")

SUMMARY_INTERVAL_S = 60.0
# uvicorn logs this WARNING for every request it cannot parse, before the worker can answer
UVICORN_MALFORMED = "Invalid HTTP request received."


class RefusalLog:
    def __init__(self, interval_s: float = SUMMARY_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.pending: Counter[str] = Counter()
        self.seen: set[str] = set()
        self.last = time.monotonic()

    def refused(self, kind: str, detail: str = "") -> None:
        """Count one refusal of ``kind`` (e.g. "malformed HTTP", "431")."""
        if kind not in self.seen:
            self.seen.add(kind)
            log.warning("refused: %s%s (further ones are summarised every %gs)",
                        kind, f" ({detail})" if detail else "", self.interval_s)  # fmt: skip
        else:
            if not self.pending:  # the summary is due even if the flood stops
                self._flush_later()
            self.pending[kind] += 1
        self.flush()

    def _flush_later(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on an event loop: the next refusal flushes
            return
        due = max(0.0, self.last + self.interval_s - time.monotonic())
        loop.call_later(due + 0.01, self.flush)

    def flush(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self.pending and now - self.last >= self.interval_s:
            counts = ", ".join(f"{kind}: {n}" for kind, n in sorted(self.pending.items()))
            log.warning("refused in the last %.1fs: %s", now - self.last, counts)
            self.pending.clear()
            self.last = now


REFUSALS = RefusalLog()


class SummariseMalformed(logging.Filter):
    """On uvicorn's error logger: its per-request "Invalid HTTP request received." warning
    becomes a count in ``REFUSALS``; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and record.getMessage() == UVICORN_MALFORMED:
            REFUSALS.refused("malformed HTTP")
            return False
        return True


_FILTER = SummariseMalformed()


def install() -> None:
    """Idempotent; the worker's HTTP protocol calls it."""
    logger = logging.getLogger("uvicorn.error")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
