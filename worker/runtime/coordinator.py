"""``Coordinator``: runs the stage processes of a node plan as one pipeline (the
``worker.contract.pipeline.Pipeline`` that the HTTP side drives).

It launches one OS process per ``ProcessPlan`` of the node plan (stages of a process group
share it), forwards what crosses processes along the request's ``Route`` (final payloads and
stream chunks between stages of different processes; stages of one process hand over to each
other in place, see ``dispatch.py``), turns terminal outputs into engine events, keeps count of
the bytes each edge serialised, and owns failure handling:
a process that dies fails its in-flight requests at once with ``StageFailed`` and is restarted
until its stages report ready again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from fleet.records import ProcessMemory
from planner.plan import NodePlan, ProcessPlan
from planner.spec import Executor, ModelSpec
from worker.contract.options import RequestInput
from worker.contract.pipeline import (
    AudioChunk,
    ClipStart,
    Event,
    Finished,
    GenerationRequest,
    PipelineStatus,
    ProgressCallback,
    RequestInvalid,
    StageFailed,
    StageLoad,
    TextDelta,
    TokenLogprob,
    WordTimings,
    outputs_of,
)
from worker.models.voices import CheckpointVoices
from worker.runtime import transport
from worker.runtime.dispatch import Edge, EdgeTraffic
from worker.runtime.graph import Route, route
from worker.runtime.host import HostConfig
from worker.runtime.process import StageProcess
from worker.runtime.transport import pack, refs, release, unpack
from worker.stages import messages as m
from worker.stages.base import RequestMeta
from worker.stages.messages import REQUEST_INPUT
from worker.stages.payloads import TextPiece

log = logging.getLogger("omni.worker.runtime")

START_TIMEOUT = 600.0  # seconds for every stage to load and warm up
RESTART_BACKOFF = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
_ENGINE_IDS = itertools.count()


@dataclass(eq=False)
class _Request:
    rid: str
    replica: _Replica
    route: Route
    queue: asyncio.Queue
    public_id: str
    groups: set[str] = field(default_factory=set)  # process groups of its active stages
    terminals_left: set[str] = field(default_factory=set)
    info: dict[str, dict] = field(default_factory=dict)
    shm: set[str] = field(default_factory=set)
    closed: bool = False
    text_pump: asyncio.Task | None = None  # sends a streamed text on to its reader


@dataclass(eq=False)
class _Replica:
    index: int
    plans: dict[str, ProcessPlan]  # process group -> plan
    stage_group: dict[str, str] = field(default_factory=dict)
    procs: dict[str, StageProcess] = field(default_factory=dict)
    down: dict[str, str] = field(default_factory=dict)  # group -> why
    restarting: set[str] = field(default_factory=set)
    load: dict[str, tuple[int, float]] = field(default_factory=dict)
    # process group -> its edges' counts since the process started
    traffic: dict[str, dict[Edge, tuple[int, int, int]]] = field(default_factory=dict)
    peaks: dict[str, int] = field(default_factory=dict)  # process name -> its peak bytes
    requests: dict[str, _Request] = field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return not self.down and all(p.all_ready for p in self.procs.values())


def _stage_threads(cores: int, cpu_processes: int) -> int:
    """Torch threads of each CPU stage process: the cores shared out, less one that the worker's
    own process keeps (HTTP, audio decoding, tokenizing): an OpenMP team over every core spins
    on the core the front needs. On 2 cores tiny-qwen3-asr's one stage process with 2 threads
    served 55-65 transcriptions/s at concurrency 8, with 1 thread 72-75 (both engines alike)."""
    return max(1, (cores - 1) // cpu_processes) if cores > 1 else 1


class Coordinator:
    def __init__(
        self,
        spec: ModelSpec,
        node_plan: NodePlan,
        checkpoint: Callable[[ProgressCallback], Path],
        voices: CheckpointVoices,
        families: tuple[str, ...] = (),
    ) -> None:
        """``checkpoint``: what gives the directory the stages load from (building the seeded
        one where the spec asks for it, reporting progress), run in a thread at start;
        ``voices``: what the checkpoint says of its voices (both the daemon's, from
        ``worker.models``: the coordinator reads no model file); ``families``: the packages of
        model families from outside ``worker/models/`` that the worker added
        (``registry.add``), for each stage process to add too."""
        self.spec = spec
        self.families = families
        self.node_plan = node_plan
        self._prepare_checkpoint = checkpoint
        self._spec_json = spec.model_dump_json()
        self._routes: dict[frozenset[str], Route] = {}
        self._limits: dict[frozenset[str], dict[str, int]] = {}
        self._ids = itertools.count()
        self._replicas: list[_Replica] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._progress: ProgressCallback = lambda _msg: None
        self._checkpoint: Path | None = None
        self._started = False
        self._stopping = False
        self._shutting_down = False  # the worker is stopping: stage exits are expected
        self._fatal: str | None = None
        self._changed: asyncio.Event = None  # type: ignore[assignment]  # made in start()
        self._restarts: set[asyncio.Task] = set()
        self._voices = voices
        cpu_procs = sum(1 for p in node_plan.processes if p.device == "cpu") or 1
        self.shm_prefix = f"omni{os.getpid()}x{next(_ENGINE_IDS)}"
        # request_id -> [(monotonic time, stage, what)]: what each stage sent and was sent, for
        # tests and diagnostics; None = off
        self.trace: dict[str, list[tuple[float, str, str]]] | None = None
        self._threads = int(os.environ.get("OMNI_STAGE_THREADS", 0)) or _stage_threads(
            os.cpu_count() or 1, cpu_procs
        )

    # ---- Engine protocol -------------------------------------------------------------------
    async def start(self, progress: ProgressCallback) -> None:
        self._loop = asyncio.get_running_loop()
        self._progress = progress
        self._changed = asyncio.Event()
        progress(f"preparing weights for {self.spec.name}")
        loop = self._loop

        def progress_from_thread(msg: str) -> None:
            loop.call_soon_threadsafe(progress, msg)

        self._checkpoint = await asyncio.to_thread(self._prepare_checkpoint, progress_from_thread)
        by_replica: dict[int, dict[str, ProcessPlan]] = {}
        for pp in self.node_plan.processes:
            by_replica.setdefault(pp.replica, {})[pp.group] = pp
        for index in sorted(by_replica):
            rep = _Replica(index, by_replica[index])
            for group, pp in rep.plans.items():
                for sp in pp.stages:
                    rep.stage_group[sp.stage] = group
            missing = set(self.spec.stages) - set(rep.stage_group)
            if missing:
                raise ValueError(f"replica {index} of the plan lacks stages {sorted(missing)}")
            self._replicas.append(rep)
        if not self._replicas:
            raise ValueError("the node plan has no processes")
        progress(f"launching {len(self.node_plan.processes)} stage processes")
        for rep in self._replicas:
            for group in rep.plans:
                await self._spawn(rep, group)
        deadline = time.monotonic() + START_TIMEOUT
        while not all(r.healthy for r in self._replicas):
            if self._fatal:
                await self.stop()
                raise RuntimeError(f"a stage failed to start:\n{self._fatal}")
            left = deadline - time.monotonic()
            if left <= 0:
                await self.stop()
                raise TimeoutError(f"stages not ready after {START_TIMEOUT:.0f} s")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(left, 1.0))
        self._started = True
        progress("all stages ready")

    def generate(self, request: GenerationRequest) -> AsyncIterator[Event]:
        return self._generate(request)

    def status(self) -> PipelineStatus:
        stages: dict[str, StageLoad] = {}
        for name in self.spec.stages:
            loads = [r.load.get(name, (0, 0.0)) for r in self._replicas]
            depth = sum(d for d, _ in loads)
            busy = sum(b for _, b in loads) / len(loads) if loads else 0.0
            stages[name] = StageLoad(queue_depth=depth, busy=round(busy, 4))
        healthy = bool(self._replicas) and all(r.healthy for r in self._replicas)
        ready = self._started and not self._stopping and any(r.healthy for r in self._replicas)
        detail = "; ".join(
            f"replica {r.index}: restarting process group {g} ({why})"
            for r in self._replicas
            for g, why in r.down.items()
        )
        if not self._started:
            detail = detail or "starting"
        if self._stopping:
            detail = "stopped"
        return PipelineStatus(ready, healthy, stages, detail, self._memory())

    def _memory(self) -> dict[str, ProcessMemory]:
        """Each stage process's planned memory (per GPU; on the CPU, its stages' host memory)
        beside the most it has held, as its last load report measured it."""
        out: dict[str, ProcessMemory] = {}
        for rep in self._replicas:
            for pp in rep.plans.values():
                on_gpu = pp.device == "gpu"
                planned = (
                    pp.memory_per_gpu.total if on_gpu else sum(s.memory.total for s in pp.stages)
                )
                out[pp.name] = ProcessMemory(
                    device=pp.device,
                    planned_bytes=planned,
                    peak_bytes=rep.peaks.get(pp.name, 0),
                    limit_fraction=pp.allocator_fraction if on_gpu else None,
                )
        return out

    def speakers(self) -> list[str]:
        return list(self._voices.speakers)

    def follows_instructions(self) -> bool:
        return self._voices.follows_instructions

    def designed_voice(self) -> str | None:
        return self._voices.designed_voice

    def stage_limits(self, outputs: frozenset[str]) -> dict[str, int]:
        limits = self._limits.get(outputs)
        if limits is None:
            stages = self.spec.stages
            limits = {
                s: 0
                for s in self._route_of(outputs).active
                if stages[s].executor == Executor.AUTOREGRESSIVE
            }
            for pp in self.node_plan.processes:
                for sp in pp.stages:
                    if sp.stage in limits:
                        engine = stages[sp.stage].engine
                        running = sp.max_running_requests or engine.max_running_requests
                        limits[sp.stage] += running + engine.max_queued_requests
            self._limits[outputs] = limits
        return limits

    def _route_of(self, outputs: frozenset[str]) -> Route:
        rt = self._routes.get(outputs)
        if rt is None:
            rt = self._routes[outputs] = route(self.spec, outputs)
        return rt

    def expect_shutdown(self) -> None:
        """The worker is stopping (its SIGTERM or Ctrl-C, which usually reaches the stage
        processes too, as one process group): from now on a stage process that exits is
        neither restarted nor reported as an error. Requests still in flight keep running on
        the processes that are alive."""
        self._shutting_down = True
        for task in list(self._restarts):
            task.cancel()

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._restarts):
            task.cancel()
        for rep in self._replicas:
            for req in list(rep.requests.values()):
                self._fail(req, StageFailed("the engine is stopping"))
        procs = [p for rep in self._replicas for p in rep.procs.values()]
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in procs))
        transport.sweep(self.shm_prefix)

    # ---- test and diagnostics hooks --------------------------------------------------------
    def process_pids(self) -> dict[str, int | None]:
        """Process name (``<replica>/<group>``) -> OS pid."""
        return {p.name: p.pid for rep in self._replicas for p in rep.procs.values()}

    def in_flight(self) -> int:
        return sum(len(r.requests) for r in self._replicas)

    def edge_traffic(self) -> dict[Edge, EdgeTraffic]:
        """(source stage, target stage) -> payloads handed over in place and serialised (with
        their bytes), summed over the running processes (as of their last load report)."""
        total: dict[Edge, EdgeTraffic] = {}
        for rep in self._replicas:
            for edges in rep.traffic.values():
                for edge, (local, sent, size) in edges.items():
                    t = total.setdefault(edge, EdgeTraffic())
                    t.handed_over += local
                    t.serialised += sent
                    t.bytes += size
        return total

    # ---- requests --------------------------------------------------------------------------
    async def _generate(self, request: GenerationRequest) -> AsyncIterator[Event]:
        req = self._submit(request)
        try:
            while True:
                ev = await req.queue.get()
                if isinstance(ev, BaseException):
                    raise ev
                yield ev
                if isinstance(ev, Finished):
                    return
        finally:
            if not req.closed:
                self._close(req)

    def _submit(self, request: GenerationRequest) -> _Request:
        if not self._started or self._stopping:
            raise StageFailed("the engine is not running")
        healthy = [r for r in self._replicas if r.healthy]
        if not healthy:
            raise StageFailed(f"no healthy pipeline: {self.status().detail}")
        rep = min(healthy, key=lambda r: len(r.requests))
        outputs = outputs_of(request.kind, request.output_audio, request.word_timestamps)
        rt = self._route_of(outputs)
        rid = f"{request.request_id or 'req'}#{next(self._ids)}"
        metas = {
            s: RequestMeta(
                kind=str(request.kind),
                outputs=outputs,
                max_tokens=request.max_tokens,
                stream_targets=rt.stream_targets[s],
                sampling=request.sampling,
                speech_sampling=request.speech_sampling,
                stop=request.stop,
                logprobs=request.logprobs,
                grammar=request.grammar,
            )
            for s in rt.active
        }
        req = _Request(rid, rep, rt, asyncio.Queue(), request.request_id)
        req.terminals_left = set(rt.terminals)
        payload = pack(
            RequestInput(
                kind=str(request.kind),
                messages=request.messages,
                tools=request.tools,
                text=request.text,
                text_follows=request.text_stream is not None,
                prompt_ids=request.prompt_ids,
                audio=request.audio,
                voice=request.voice,
                voice_audio=request.voice_audio,
                max_tokens=request.max_tokens,
                output_audio="audio" in outputs,
                speech=request.speech,
                transcription=request.transcription,
            ),
            self.shm_prefix,
        )
        req.shm.update(refs(payload))
        rep.requests[rid] = req
        by_group: dict[str, dict[str, RequestMeta]] = {}
        for stage in rt.active:
            by_group.setdefault(rep.stage_group[stage], {})[stage] = metas[stage]
        req.groups = set(by_group)
        for group, group_metas in by_group.items():
            rep.procs[group].send((m.OPEN, rid, group_metas))
        entry = self.spec.entry
        self._send(req, entry, (m.INPUT, entry, rid, REQUEST_INPUT, payload))
        self._flush(rep)
        if request.text_stream is not None:
            req.text_pump = asyncio.create_task(self._pump_text(req, request.text_stream))
        return req

    async def _pump_text(self, req: _Request, text: AsyncIterator[str]) -> None:
        """A streamed text, piece by piece, to the stage that reads it (the talker: the
        route's autoregressive stage), then its end. A failing source ends the request."""
        reader = next(
            s for s in req.route.active if self.spec.stages[s].executor == Executor.AUTOREGRESSIVE
        )
        try:
            async for piece in text:
                if req.closed:
                    return
                if piece:
                    chunk = TextPiece(piece)
                    self._send(req, reader, (m.CHUNK, reader, req.rid, REQUEST_INPUT, chunk))
                    self._flush(req.replica)
        except Exception as exc:  # the client's text source broke: the request cannot go on
            self._fail(req, StageFailed(f"the streamed text ended abnormally: {exc}"))
            return
        if not req.closed:
            self._send(req, reader, (m.END, reader, req.rid, REQUEST_INPUT, {}))
            self._flush(req.replica)

    def _send(self, req: _Request, stage: str, msg: tuple) -> None:
        self._trace(req, stage, f"<-{msg[0]}")
        rep = req.replica
        rep.procs[rep.stage_group[stage]].send(msg)

    def _trace(self, req: _Request, stage: str, what: str) -> None:
        if self.trace is not None:
            self.trace.setdefault(req.public_id, []).append((time.monotonic(), stage, what))

    def _finish(self, req: _Request) -> None:
        info = self._summary(req)
        # A stop text ends the reply "stop" even where the generating stage had reached its
        # length before the stage that reads the text found it (they run apart: either order)
        stop_text = any(i.get("stop_text") for i in req.info.values())
        req.queue.put_nowait(
            Finished(
                finish_reason="stop" if stop_text else info.get("finish_reason", "stop"),
                prompt_tokens=int(info.get("prompt_tokens", 0)),
                completion_tokens=int(info.get("completion_tokens", 0)),
                cached_tokens=int(info.get("cached_tokens", 0)),
                text_tokens_read=next(
                    (
                        int(i["text_tokens_read"])
                        for i in req.info.values()
                        if "text_tokens_read" in i
                    ),
                    None,
                ),
            )
        )
        self._close(req)

    def _summary(self, req: _Request) -> dict:
        # the first stage in spec order that reported token counts (the thinker)
        for stage in req.route.active:
            if "completion_tokens" in req.info.get(stage, {}):
                return req.info[stage]
        return next(iter(req.info.values()), {})

    def _fail(self, req: _Request, exc: StageFailed) -> None:
        if req.closed:
            return
        req.queue.put_nowait(exc)
        self._close(req)

    def _close(self, req: _Request) -> None:
        if req.closed:
            return
        req.closed = True
        if req.text_pump is not None:
            req.text_pump.cancel()
        rep = req.replica
        rep.requests.pop(req.rid, None)
        for g in req.groups:  # finished or not: every process forgets it
            if g in rep.procs and g not in rep.down:
                rep.procs[g].send((m.CLOSE, req.rid))
        self._flush(rep)
        release(req.shm)
        req.shm.clear()

    # ---- messages from stage processes (on the event loop) ---------------------------------
    def _flush(self, rep: _Replica) -> None:
        for proc in rep.procs.values():
            proc.flush()

    def _on_messages(self, rep: _Replica, proc: StageProcess, msgs: list[tuple]) -> None:
        try:
            self._handle(rep, proc, msgs)
        finally:
            self._flush(rep)

    def _handle(self, rep: _Replica, proc: StageProcess, msgs: list[tuple]) -> None:
        for msg in msgs:
            kind = msg[0]
            if kind == m.LOAD:
                rep.load.update(msg[1])
                rep.traffic[proc.cfg.process] = msg[2]
                rep.peaks[proc.cfg.process] = msg[3]
            elif kind == m.PROGRESS:
                self._progress(msg[1])
            elif kind == m.READY:
                proc.ready.add(msg[1])
                self._progress(f"{proc.name}: {msg[1]} ready")
                self._changed.set()
            elif kind == m.FATAL:
                log.error("stage process %s failed to load:\n%s", proc.name, msg[1])
                if not self._started:
                    self._fatal = f"{proc.name}: {msg[1]}"
                    self._changed.set()
            else:
                self._route(rep, msg)

    def _route(self, rep: _Replica, msg: tuple) -> None:
        kind, stage, rid, payload = msg
        req = rep.requests.get(rid)
        if req is None:  # late output of an aborted or failed request
            release(refs(payload))
            return
        req.shm.update(refs(payload))
        self._trace(req, stage, kind)
        rt = req.route
        if kind in (m.FINAL, m.CHUNK, m.END):
            # the source's process handed it to its own stages already
            targets = rt.next_targets[stage] if kind == m.FINAL else rt.stream_targets[stage]
            here = rep.stage_group[stage]
            forward = m.INPUT if kind == m.FINAL else kind
            for t in targets:
                if rep.stage_group[t] != here:
                    self._send(req, t, (forward, t, rid, stage, payload))
            if kind == m.END:
                req.info[stage] = payload
        elif kind == m.OUT:
            what, data = payload[0], payload[1]
            if what == "text":
                entries = [TokenLogprob(*e) for e in payload[2]] if len(payload) > 2 else None
                req.queue.put_nowait(TextDelta(data, entries))
            elif what == "clip":
                req.queue.put_nowait(ClipStart(*data))
            elif what == "words":
                req.queue.put_nowait(WordTimings([(w, a, b) for w, a, b in data]))
            else:
                names = refs(data)
                pcm = unpack(data, unlink=True)
                req.shm.difference_update(names)
                req.queue.put_nowait(AudioChunk(pcm.astype("<i2", copy=False).tobytes()))
        elif kind == m.DONE:
            req.info.setdefault(stage, payload)
            req.terminals_left.discard(stage)
            if not req.terminals_left:
                self._finish(req)
        elif kind == m.ERROR:
            self._fail(req, StageFailed(str(payload)))
        elif kind == m.INVALID:
            self._fail(req, RequestInvalid(str(payload)))

    # ---- process lifecycle -----------------------------------------------------------------
    async def _spawn(self, rep: _Replica, group: str) -> None:
        pp = rep.plans[group]
        assert self._checkpoint is not None
        cfg = HostConfig.of_process(
            pp,
            self.node_plan,
            self._spec_json,
            str(self._checkpoint),
            threads=self._threads,
            shm_prefix=self.shm_prefix,
            families=self.families,
        )
        loop = self._loop
        assert loop is not None
        holder: dict[str, StageProcess] = {}
        # The process's reader thread may deliver its first messages (a fast stage is ready
        # at once) before the constructor has returned here: they wait on the loop for it.
        # (They once raised KeyError in the reader thread, which then died: that process's
        # READY never arrived and the start hung.)
        early: list[Callable[[StageProcess], None]] = []

        def on_loop(handle: Callable[[StageProcess], None]) -> None:
            proc = holder.get("p")
            if proc is None:
                early.append(handle)
            else:
                handle(proc)

        def on_messages(msgs: list[tuple]) -> None:
            loop.call_soon_threadsafe(on_loop, lambda p: self._on_messages(rep, p, msgs))

        def on_exit(code: int | None) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(on_loop, lambda p: self._on_exit(rep, group, p, code))

        proc = await asyncio.to_thread(StageProcess, cfg, on_messages, on_exit)
        holder["p"] = proc
        rep.procs[group] = proc
        for handle in early:
            handle(proc)
        early.clear()

    def _on_exit(self, rep: _Replica, group: str, proc: StageProcess, code: int | None) -> None:
        proc.close()
        if self._stopping or rep.procs.get(group) is not proc:
            return
        why = f"process {proc.name} (pid {proc.pid}) exited with code {code}"
        if self._shutting_down:
            log.info("stage %s while the worker stops; not restarted", why)
        else:
            log.error("stage %s", why)
        if not self._started:
            self._fatal = self._fatal or why
            self._changed.set()
            return
        rep.down[group] = why
        stages = {sp.stage for sp in rep.plans[group].stages}
        for s in stages:
            rep.load[s] = (0, 0.0)
        for req in list(rep.requests.values()):
            if stages & set(req.route.active):
                self._fail(req, StageFailed(f"stage {'/'.join(sorted(stages))} failed: {why}"))
        if group in rep.restarting or self._shutting_down:  # its loop retries / we stop
            return
        task = asyncio.ensure_future(self._restart(rep, group))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, rep: _Replica, group: str) -> None:
        rep.restarting.add(group)
        try:
            await self._restart_loop(rep, group)
        finally:
            rep.restarting.discard(group)

    async def _restart_loop(self, rep: _Replica, group: str) -> None:
        for attempt in itertools.count():
            if self._stopping or self._shutting_down:
                return
            self._progress(f"restarting process group {group} (attempt {attempt + 1})")
            await self._spawn(rep, group)
            proc = rep.procs[group]
            while proc.proc.is_alive() and not proc.all_ready and not self._stopping:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=0.5)
            if proc.all_ready and proc.proc.is_alive():
                rep.down.pop(group, None)
                self._progress(f"process group {group} is ready again")
                return
            await asyncio.sleep(RESTART_BACKOFF[min(attempt, len(RESTART_BACKOFF) - 1)])
