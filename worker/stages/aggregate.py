"""Aggregate (fan-in, no weights): merges the final payloads of several stages into one."""

from __future__ import annotations

from typing import Any

from worker.stages.base import FINAL, Output, RequestMeta, StageExecutor


class AggregateExecutor(StageExecutor):
    def load(self) -> None:
        self.ready: list[tuple[str, dict[str, Any]]] = []

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        merged: dict[str, Any] = {}
        for src in sorted(inputs):  # sorted: the merge does not depend on arrival order
            merged.update(inputs[src])
        self.ready.append((rid, merged))

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
