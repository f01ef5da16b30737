"""One request on its way to a worker, as the router holds it for a retry, and the backoff
between tries."""

from __future__ import annotations

import random

from router.classify import Classified


def retry_backoff(base_s: float, attempt: int) -> float:
    """Full-jitter exponential backoff before retry number ``attempt`` (1, 2, ...)."""
    return random.uniform(0, base_s * 2 ** (attempt - 1))


class Dispatch:
    """One request on its way to a worker (kept for retries)."""

    __slots__ = (
        "attempt",
        "bind_key",
        "body",
        "c",
        "deadline",
        "failovers",
        "head_tail",
        "reqline",
        "retryable",
        "rid_line",
        "tried",
    )

    def __init__(
        self,
        c: Classified,
        reqline: bytes,
        head_tail: bytes,
        body: bytes,
        rid_line: bytes,
        retryable: bool = True,
    ) -> None:
        self.c = c
        self.reqline = reqline
        self.head_tail = head_tail
        self.body = body
        self.rid_line = rid_line
        self.attempt = 0
        self.deadline = 0.0
        self.failovers = 0  # times its stream resumed on another worker after it broke
        self.tried: set[str] = set()
        self.retryable = retryable  # the whole body is here (not a streamed upload): resendable
        self.bind_key: str | None = None  # a session bound by this request: undone if refused
