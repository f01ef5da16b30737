"""Inside one stage process: start each stage once its inputs are complete, and hand outputs on.

An edge between two stages of this process is handed over in place: the payload object (torch
tensors on the stage's device included) goes straight to the receiving executor: no copy, no
serialisation, no trip through the coordinator. Only an output that leaves the process (an
edge to a stage of another process, client output, a stage's end) goes to the coordinator,
packed (large arrays through shared memory, see transport.py). Per edge it counts payloads
handed over in place and serialised (with their bytes), reported with the process's load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from planner.spec import ModelSpec
from worker.runtime.graph import Route, route
from worker.runtime.transport import nbytes, pack, unpack
from worker.stages import messages as m
from worker.stages.base import RequestMeta, StageExecutor

Edge = tuple[str, str]  # (source stage, target stage)


@dataclass(slots=True)
class EdgeTraffic:
    handed_over: int = 0  # payloads passed in place to a stage of the same process
    serialised: int = 0  # payloads packed for a stage of another process
    bytes: int = 0  # array bytes of the serialised payloads

    def as_tuple(self) -> tuple[int, int, int]:
        return self.handed_over, self.serialised, self.bytes


@dataclass(slots=True)
class _Request:
    route: Route
    metas: dict[str, RequestMeta]  # its active stages in this process
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage -> src -> payload
    started: set[str] = field(default_factory=set)
    # stream messages that arrived before their stage started: stage -> [(kind, src, data)]
    early: dict[str, list[tuple[str, str, Any]]] = field(default_factory=dict)


class Dispatcher:
    def __init__(self, spec: ModelSpec, executors: dict[str, StageExecutor]) -> None:
        self.spec = spec
        self.executors = executors
        self.requests: dict[str, _Request] = {}
        self.traffic: dict[Edge, EdgeTraffic] = {}
        self.outbox: list[tuple] = []  # messages for the coordinator
        self._routes: dict[frozenset[str], Route] = {}

    # ---- from the coordinator --------------------------------------------------------------
    def open(self, rid: str, metas: dict[str, RequestMeta]) -> None:
        outputs = next(iter(metas.values())).outputs
        rt = self._routes.get(outputs)
        if rt is None:
            rt = self._routes[outputs] = route(self.spec, outputs)
        req = self.requests[rid] = _Request(rt, metas)
        for stage in metas:
            self._maybe_start(rid, req, stage)

    def receive(self, kind: str, stage: str, rid: str, src: str, payload: Any) -> None:
        """INPUT/CHUNK/END from a stage of another process (or the request itself)."""
        req = self.requests.get(rid)
        if req is None:  # closed meanwhile
            return
        try:
            data = unpack(payload)
        except FileNotFoundError:  # its shared memory was released: the request was aborted
            return
        self._deliver(rid, req, kind, stage, src, data)

    def close(self, rid: str) -> None:
        self.requests.pop(rid, None)
        for ex in self.executors.values():
            ex.abort(rid)

    # ---- from this process's executors -----------------------------------------------------
    def emit(self, stage: str, outputs: list[m.Output]) -> None:
        for kind, rid, payload in outputs:
            if kind in (m.FINAL, m.CHUNK, m.END):
                self._forward(stage, kind, rid, payload)
            else:
                self.outbox.append((kind, stage, rid, pack(payload)))

    def take(self) -> list[tuple]:
        out, self.outbox = self.outbox, []
        return out

    def traffic_report(self) -> dict[Edge, tuple[int, int, int]]:
        return {edge: t.as_tuple() for edge, t in self.traffic.items()}

    # ---- routing ---------------------------------------------------------------------------
    def _forward(self, stage: str, kind: str, rid: str, payload: Any) -> None:
        req = self.requests.get(rid)
        if req is None:  # closed while the stage worked on it
            return
        rt = req.route
        targets = rt.next_targets[stage] if kind == m.FINAL else rt.stream_targets[stage]
        local = [t for t in targets if t in self.executors]
        remote = [t for t in targets if t not in self.executors]
        if remote:
            size = nbytes(payload)
            self.outbox.append((kind, stage, rid, pack(payload)))
            for t in remote:
                traffic = self._edge(stage, t)
                traffic.serialised += 1
                traffic.bytes += size
        for t in local:
            self._edge(stage, t).handed_over += 1
            self._deliver(rid, req, m.INPUT if kind == m.FINAL else kind, t, stage, payload)

    def _edge(self, src: str, dst: str) -> EdgeTraffic:
        traffic = self.traffic.get((src, dst))
        if traffic is None:
            traffic = self.traffic[(src, dst)] = EdgeTraffic()
        return traffic

    def _deliver(self, rid: str, req: _Request, kind: str, stage: str, src: str, data: Any) -> None:
        if kind == m.INPUT:
            req.inputs.setdefault(stage, {})[src] = data
            self._maybe_start(rid, req, stage)
        elif stage in req.started:
            self._stream(rid, kind, stage, src, data)
        else:
            req.early.setdefault(stage, []).append((kind, src, data))

    def _maybe_start(self, rid: str, req: _Request, stage: str) -> None:
        if stage in req.started or not req.route.required[stage] <= set(req.inputs.get(stage, {})):
            return
        req.started.add(stage)
        inputs = req.inputs.pop(stage, {})
        ex = self.executors[stage]
        if self._call(stage, rid, lambda: ex.start(rid, req.metas[stage], inputs)):
            for kind, src, data in req.early.pop(stage, []):
                self._stream(rid, kind, stage, src, data)

    def _stream(self, rid: str, kind: str, stage: str, src: str, data: Any) -> None:
        ex = self.executors[stage]
        if kind == m.CHUNK:
            self._call(stage, rid, lambda: ex.feed(rid, src, data))
        else:
            self._call(stage, rid, lambda: ex.end_stream(rid, src, data))

    def _call(self, stage: str, rid: str, fn: Callable[[], None]) -> bool:
        """Run one executor call; an exception fails the request in that stage only."""
        try:
            fn()
        except Exception as exc:
            self.executors[stage].abort(rid)
            self.outbox.append((m.ERROR, stage, rid, f"{stage}: {exc}"))
            return False
        return True
