"""The life of one worker: detect GPUs, plan (the same planner and plan object as
``omni-plan``), register as ``starting``, start the pipeline with visible progress, serve,
mark ``ready``; on SIGTERM mark ``draining`` at once, finish in-flight work up to the
deadline, deregister, stop the pipeline and exit 0."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from fleet.records import Endpoint, WorkerRecord, WorkerStatus
from fleet.responses import RedisResponses
from fleet.settings import redacted_url
from fleet.store import FleetStore, connect
from planner.plan import LaunchPlan, NodePlan
from planner.spec import Executor, ModelSpec, resolve_model_dir
from worker import gpus as gpu_detection
from worker.api.app import create_app
from worker.api.protocol import worker_http_protocol
from worker.contract import grammar as grammars
from worker.contract.pipeline import Pipeline
from worker.metrics import WorkerMetrics
from worker.registration import Registrar
from worker.service import WorkerService, capabilities_of
from worker.settings import WorkerSettings

if TYPE_CHECKING:
    from worker.models.family import Family
    from worker.runtime.coordinator import Coordinator

log = logging.getLogger("omni-worker")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_SPEC = 2  # the spec or an override is wrong
EXIT_DOES_NOT_FIT = 3  # the planner says the model does not fit this node
EXIT_NO_CUDA = 4  # the plan places stages on GPUs this environment's torch cannot use
_REALTIME_CLOSE_S = 5.0  # after the drain: for open realtime sessions to say goodbye


class StartupError(Exception):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Planned:
    spec: ModelSpec
    spec_path: Path
    plan: LaunchPlan
    node_plan: NodePlan


def prefix_cache_tokens(spec: ModelSpec, node_plan: NodePlan) -> int:
    """Tokens of chat prompt prefix this worker keeps for reuse: the KV pools of its stages on
    SGLang (its radix cache; 0 where none serves chat), as the router's cache-aware policy
    sizes its record of what is cached here."""
    if Endpoint.CHAT not in spec.capabilities.endpoints:
        return 0
    engines = {n: s.engine for n, s in spec.stages.items() if s.executor == Executor.AUTOREGRESSIVE}
    total = 0
    for process in node_plan.processes:
        for placed in process.stages:
            engine = engines.get(placed.stage)
            if engine is not None:  # (a pool the plan leaves open is sized as SGLang sizes it)
                total += placed.kv_tokens or engine.context_length * engine.max_running_requests
    return total


def inventory_of(settings: WorkerSettings):  # -> planner.inventory.Inventory
    """``--gpus`` (the planner's own syntax, e.g. ``2xH100-80GB`` or ``cpu``) or detection."""
    from planner.inventory import Inventory

    if settings.gpus is not None:
        inventory = Inventory.parse(settings.gpus, node=settings.node)
        log.info("GPUs from --gpus: %s", settings.gpus)
        return inventory
    found, method = gpu_detection.detect()
    log.info("GPUs detected (%s): %s", method, _describe(found))
    return Inventory.from_devices(settings.node, found)


def _describe(found: list[tuple[str, int]]) -> str:
    if not found:
        return "none, CPU only"
    return ", ".join(
        f"{i}: {name} {total / 2**30:.1f} GiB" for i, (name, total) in enumerate(found)
    )


def plan_node(settings: WorkerSettings, overrides: list[str]) -> Planned:
    """Run the planner exactly as ``omni-plan`` does, on this node's GPUs."""
    from planner.api import plan_spec
    from planner.model_dir import resolve_model_dir

    spec_path = settings.resolved_spec()
    if not spec_path.exists():
        raise StartupError(f"spec not found: {spec_path}", EXIT_BAD_SPEC)
    try:
        inventory = inventory_of(settings)
        model_dir = None
        if settings.model_dir:
            model_dir = resolve_model_dir(settings.model_dir, settings.allow_download)
        result = plan_spec(
            spec_path,
            # "cpu" as such: every stage of the spec moves to the CPU
            inventory="cpu" if (settings.gpus or "").strip().lower() == "cpu" else inventory,
            overrides=tuple(settings.overrides) + tuple(overrides),
            override_file=settings.override_file,
            model_dir=model_dir,
        )
    except (ValueError, KeyError, FileNotFoundError) as exc:
        raise StartupError(f"{spec_path}: {exc}", EXIT_BAD_SPEC) from exc
    plan = result.plan
    _print_plan(plan, settings)
    if not plan.fits:
        lines = [f"{spec_path.name} does not fit this node ({settings.node}):"]
        for error in plan.errors:
            lines.append(f"  {error.message}")
            lines.extend(f"    fix: {fix}" for fix in error.fixes)
        raise StartupError("\n".join(lines), EXIT_DOES_NOT_FIT)
    node_plan = next((n for n in plan.nodes if n.node == settings.node), None)
    if node_plan is None:
        if len(plan.nodes) != 1:
            raise StartupError(f"plan has no node {settings.node!r}", EXIT_FAILED)
        node_plan = plan.nodes[0]
    gpus = {g for p in node_plan.processes for g in p.gpus}
    if gpus:  # before any stage starts: a stage would die in torch's "driver too old"
        problem = gpu_detection.cuda_problem(max(gpus) + 1)
        if problem is not None:
            raise StartupError(f"{spec_path.name}: {problem}", EXIT_NO_CUDA)
    log.info(
        "plan %s: %d replica(s), %d process(es): %s",
        plan.digest(),
        len(node_plan.replicas),
        len(node_plan.processes),
        ", ".join(f"{p.name}[{'+'.join(f'{s.stage}:{s.dtype}' for s in p.stages)}]@{p.device}"
                  for p in node_plan.processes),
    )  # fmt: skip
    return Planned(result.spec, result.spec_path, plan, node_plan)


def _print_plan(plan: LaunchPlan, settings: WorkerSettings) -> None:
    """The same tables ``omni-plan`` prints, on stderr with the log."""
    try:
        from rich.console import Console

        from planner.render import print_plan
    except ImportError:
        return
    print_plan(plan, Console(stderr=True, width=120), settings.gpus or "this node")


def make_pipeline(settings: WorkerSettings, planned: Planned) -> Pipeline:
    return coordinator_for(
        planned.spec,
        planned.spec_path,
        planned.node_plan,
        settings.cache_dir,
        families=tuple(settings.model_family),
    )


def served_family(spec: ModelSpec, spec_path: Path) -> Family:
    """The model family of the spec's checkpoint (``PLAIN``: a plain model, or not known)."""
    from worker.models.registry import PLAIN, family_of

    try:
        return family_of(resolve_model_dir(spec, spec_path))
    except (OSError, ValueError):
        return PLAIN


def coordinator_for(
    spec: ModelSpec,
    spec_path: Path,
    node_plan: NodePlan,
    cache_dir: Path,
    families: tuple[str, ...] = (),
) -> Coordinator:
    """The stage processes of ``node_plan`` on the spec's checkpoint (the seeded one built in
    ``cache_dir`` at start where the spec asks for it) with the voices it names."""
    from worker.models.checkpoint import resolve_checkpoint
    from worker.models.voices import checkpoint_voices
    from worker.runtime.coordinator import Coordinator

    return Coordinator(
        spec,
        node_plan,
        checkpoint=functools.partial(resolve_checkpoint, spec, spec_path, cache_dir),
        voices=checkpoint_voices(spec, spec_path),
        families=families,
    )


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: SIGTERM means drain, which the daemon does."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Daemon:
    def __init__(self, settings: WorkerSettings, planned: Planned, pipeline: Pipeline) -> None:
        self.settings = settings
        self.planned = planned
        self.pipeline = pipeline
        self._stop = asyncio.Event()
        self.signals = 0

    def _on_signal(self, sig: signal.Signals) -> None:
        self.signals += 1
        if self.signals == 1:
            log.info("%s: draining (deadline %.1fs)", sig.name, self.settings.drain_timeout)
            # First, before any stage exit is handled: the same signal often reaches the
            # stage processes (one process group), and their exits are then no failure.
            expect_shutdown = getattr(self.pipeline, "expect_shutdown", None)
            if expect_shutdown is not None:
                expect_shutdown()
            self._stop.set()
        else:
            log.warning("%s again: stopping without waiting for in-flight requests", sig.name)
            self.settings.drain_timeout = 0

    async def serve(self) -> int:
        settings, planned = self.settings, self.planned
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            sock = bind(settings.host, settings.port)
        except OSError as exc:
            log.error("cannot listen on %s:%s: %s", settings.host, settings.port, exc)
            return EXIT_FAILED
        port = sock.getsockname()[1]
        worker_id = settings.resolved_worker_id(port)
        url = settings.resolved_url(port)
        metrics = WorkerMetrics(planned.spec.stages, planned.spec.name)
        family = served_family(planned.spec, planned.spec_path)
        service = WorkerService(settings, planned.spec, self.pipeline, worker_id, metrics, family)
        store: FleetStore | None = None
        registrar: Registrar | None = None
        if settings.redis_url is not None:
            redis_url = settings.redis_url.get_secret_value()
            store = FleetStore(connect(redis_url), settings.fleet)
            service.store = store
            service.responses = RedisResponses(
                store.redis, settings.fleet, int(settings.stored_response_ttl * 1000)
            )
            registrar = self._registrar(store, service, url)
            log.info("fleet %r on %s as %s", settings.fleet, redacted_url(redis_url), worker_id)
            await registrar.set_status(WorkerStatus.STARTING, "loading")
            registrar.start()
        else:
            log.info("no --redis-url: serving standalone, not registered in a fleet")

        server = _Server(
            uvicorn.Config(
                create_app(service),
                log_level=settings.log_level.lower(),
                access_log=False,
                lifespan="off",
                timeout_keep_alive=5,
                timeout_graceful_shutdown=5,
                log_config=None,
                # malformed requests get JSON errors too; the head is bounded (414 / 431)
                http=worker_http_protocol(settings),
                h11_max_incomplete_event_size=settings.max_head_bytes,
            )
        )
        server_task = asyncio.create_task(server.serve(sockets=[sock]), name="http")
        log.info("HTTP API on %s (advertised %s); /ready answers 503 until the pipeline is up",
                 f"{settings.host}:{port}", url)  # fmt: skip

        exit_code = EXIT_OK
        try:
            exit_code = await self._start_and_run(service, registrar)
        finally:
            if registrar is not None:
                await registrar.deregister()
            server.should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server_task, timeout=10)
            log.info("stopping the pipeline")
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.pipeline.stop(), timeout=30)
            if store is not None:
                with contextlib.suppress(Exception):
                    await store.close()
            log.info("bye (exit %d)", exit_code)
        return exit_code

    def _registrar(self, store: FleetStore, service: WorkerService, url: str) -> Registrar:
        settings, planned = self.settings, self.planned
        record = WorkerRecord(
            id=service.worker_id,
            url=url,
            node=settings.node,
            model=planned.spec.name,
            served_models=planned.spec.served_models,
            capabilities=capabilities_of(planned.spec),
            voices=list(service.builtin_voices),
            capacity=settings.capacity,
            prefix_cache_tokens=prefix_cache_tokens(planned.spec, planned.node_plan),
            status=WorkerStatus.STARTING,
            plan_digest=planned.plan.digest(),
            plan=planned.plan.model_dump(mode="json"),
        )
        return Registrar(
            store,
            record,
            service,
            heartbeat_interval=settings.heartbeat_interval,
            ttl=settings.heartbeat_ttl,
            load_interval=settings.load_interval,
        )

    async def _start(self, service: WorkerService, progress: Callable[[str], None]) -> None:
        """The pipeline, and beside it what the API would otherwise import on its first
        request (xgrammar, for chat's response_format and tools)."""
        preload = None
        if any(
            e in (Endpoint.CHAT, Endpoint.COMPLETIONS) for e in service.spec.capabilities.endpoints
        ):
            preload = asyncio.create_task(asyncio.to_thread(grammars.preload))
        try:
            await self.pipeline.start(progress)
        finally:
            if preload is not None:
                await preload

    async def _start_and_run(self, service: WorkerService, registrar: Registrar | None) -> int:
        started = time.monotonic()

        def progress(message: str) -> None:
            # The pipeline reports restarts through the same callback once it is running.
            if service.status == WorkerStatus.STARTING:
                service.detail = message
                log.info("[start-up %5.1fs] %s", time.monotonic() - started, message)
            else:
                log.info("[pipeline] %s", message)

        start = asyncio.create_task(self._start(service, progress), name="pipeline-start")
        stop = asyncio.create_task(self._stop.wait())
        await asyncio.wait({start, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not start.done():
            log.info("stopped during start-up")
            start.cancel()
            with contextlib.suppress(BaseException):
                await start
            return EXIT_OK
        stop.cancel()
        if start.exception() is not None:
            log.error("pipeline failed to start: %s", start.exception())
            return EXIT_FAILED
        service.set_status(WorkerStatus.READY)
        if registrar is not None:
            await registrar.set_status(WorkerStatus.READY)
        log.info("ready in %.1fs: serving %s", time.monotonic() - started,
                 ", ".join(service.spec.served_models))  # fmt: skip

        watch = asyncio.create_task(self._watch_health(service, registrar), name="health")
        await self._stop.wait()
        watch.cancel()
        await self._drain(service, registrar)
        return EXIT_OK

    async def _watch_health(self, service: WorkerService, registrar: Registrar | None) -> None:
        """A dead stage process makes the pipeline unhealthy until its group restarted; the
        fleet hears of it both ways."""
        while True:
            await asyncio.sleep(min(0.1, self.settings.load_interval))
            pipeline = self.pipeline.status()
            ok = pipeline.ready and pipeline.healthy
            new: WorkerStatus | None = None
            if service.status == WorkerStatus.READY and not ok:
                new = WorkerStatus.UNHEALTHY
                log.warning("pipeline unhealthy: %s", pipeline.detail or "a stage failed")
            elif service.status == WorkerStatus.UNHEALTHY and ok:
                new = WorkerStatus.READY
                log.info("pipeline recovered")
            if new is not None:
                service.set_status(new, pipeline.detail)
                if registrar is not None:
                    await registrar.set_status(new, pipeline.detail)

    async def _drain(self, service: WorkerService, registrar: Registrar | None) -> None:
        service.set_status(WorkerStatus.DRAINING, "draining")
        if registrar is not None:
            await registrar.set_status(WorkerStatus.DRAINING, "SIGTERM")
        deadline = time.monotonic() + self.settings.drain_timeout
        if service.in_flight:
            log.info("draining: %d request(s) in flight", service.in_flight)
        while service.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if service.in_flight:
            log.warning("drain deadline passed with %d request(s) in flight", service.in_flight)
        else:
            log.info("drained")
        if service.realtime:
            # Their responses had the drain's time; now each client hears why (an error event
            # `draining`) and gets 1012, on which the SDK reconnects and the router picks
            # another worker, where the conversation resumes from Redis.
            log.info("closing %d realtime session(s)", len(service.realtime))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(service.close_realtime_sessions(), _REALTIME_CLOSE_S)


def run(settings: WorkerSettings, overrides: list[str]) -> int:
    """Plan, then serve until SIGTERM. Returns the process exit code."""
    from worker.models import registry

    try:
        registry.add(*settings.model_family)
    except ValueError as exc:
        log.error("%s", exc)
        return EXIT_BAD_SPEC
    try:
        planned = plan_node(settings, overrides)
    except StartupError as exc:
        log.error("%s", exc)
        return exc.exit_code
    pipeline = make_pipeline(settings, planned)
    daemon = Daemon(settings, planned, pipeline)
    try:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(daemon.serve())
    except ImportError:
        return asyncio.run(daemon.serve())
