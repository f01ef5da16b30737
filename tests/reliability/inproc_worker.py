"""A worker's HTTP layer in this process, served the way the daemon serves it (same app, same
HTTP protocol class, same registration and heartbeat in Redis), on the test-only FakePipeline:
for hostile-input tests that must watch the event loop, the heartbeat and the logs."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import uvicorn

from fleet.records import Capabilities, WorkerRecord, WorkerStatus
from fleet.store import FleetStore, connect
from planner.spec import ModelSpec
from tests.worker_fakes import FakePipeline
from worker.api.app import create_app
from worker.api.protocol import worker_http_protocol
from worker.daemon import _Server, bind
from worker.registration import Registrar
from worker.service import WorkerService, capabilities_of
from worker.settings import WorkerSettings

FLEET = "hostile"
SPEC = ModelSpec.model_validate(
    {
        "name": "fake-omni",
        "model_dir": ".",
        "capabilities": {
            "endpoints": ["chat", "speech", "transcription", "voices"],
            "input_modalities": ["text", "audio"],
            "output_modalities": ["text", "audio"],
        },
        "entry": "thinker",
        "stages": {"thinker": {"executor": "autoregressive", "terminal": True}},
    }
)


@dataclass
class InProcWorker:
    url: str
    port: int
    service: WorkerService
    pipeline: FakePipeline
    loop: asyncio.AbstractEventLoop
    heartbeat_key: str


class LogRecords(logging.Handler):
    """Every record at WARNING or above from any logger, whichever thread wrote it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def errors(self) -> list[str]:
        return [f"{r.name}: {r.getMessage()}" for r in self.records if r.levelno >= logging.ERROR]


@contextmanager
def captured_logs() -> Iterator[LogRecords]:
    handler = LogRecords()
    # uvicorn's loggers do not propagate to the root once it configured them: listen to both.
    loggers = [logging.getLogger(), logging.getLogger("uvicorn.error")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


@contextmanager
def inproc_worker(settings: WorkerSettings, redis_url: str) -> Iterator[InProcWorker]:
    pipeline = FakePipeline()
    service = WorkerService(settings, SPEC, pipeline, "w-hostile")
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    loop = asyncio.new_event_loop()
    server = _Server(
        uvicorn.Config(
            create_app(service),
            log_level="warning",
            lifespan="off",
            http=worker_http_protocol(settings),
        )
    )
    store = FleetStore(connect(redis_url), FLEET)
    record = WorkerRecord(
        id=service.worker_id,
        url=url,
        node="test",
        model=SPEC.name,
        served_models=SPEC.served_models,
        capabilities=Capabilities.model_validate(capabilities_of(SPEC).model_dump()),
        capacity=settings.capacity,
        status=WorkerStatus.STARTING,
    )
    registrar = Registrar(
        store,
        record,
        service,
        heartbeat_interval=settings.heartbeat_interval,
        ttl=settings.heartbeat_ttl,
        load_interval=settings.load_interval,
    )

    async def main() -> None:
        service.store = store
        await registrar.set_status(WorkerStatus.STARTING)
        registrar.start()
        await pipeline.start(lambda _m: None)
        service.set_status(WorkerStatus.READY)
        await registrar.set_status(WorkerStatus.READY)
        try:
            await server.serve(sockets=[sock])
        finally:
            await registrar.stop()
            await store.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "in-process worker did not start"
        time.sleep(0.02)
    try:
        yield InProcWorker(url, port, service, pipeline, loop, store.keys.worker(service.worker_id))
    finally:
        server.should_exit = True
        thread.join(timeout=10)
