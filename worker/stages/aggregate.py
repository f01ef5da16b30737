"""Aggregate (fan-in, no weights): the final payloads of several stages passed on together, as one
``Gathered`` (a stage after it finds each by its type)."""

from __future__ import annotations

from typing import Any

from worker.stages.base import FINAL, Output, RequestMeta, StageExecutor
from worker.stages.payloads import Gathered


class AggregateExecutor(StageExecutor):
    def load(self) -> None:
        self.ready: list[tuple[str, Gathered]] = []

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        # sorted: what it passes on does not depend on arrival order
        parts = []
        for src in sorted(inputs):
            payload = inputs[src]
            parts += payload.parts if isinstance(payload, Gathered) else [payload]
        self.ready.append((rid, Gathered(parts)))

    def abort(self, rid: str) -> None:
        self.ready = [r for r in self.ready if r[0] != rid]

    def next_deadline(self) -> float | None:
        return 0.0 if self.ready else None

    def queue_depth(self) -> int:
        return len(self.ready)

    def step(self) -> list[Output]:
        outs: list[Output] = [(FINAL, rid, payload) for rid, payload in self.ready]
        self.ready = []
        return outs
