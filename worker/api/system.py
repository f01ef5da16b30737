"""Discovery and health: /v1/models, /health (alive), /ready (serving), /load, /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from fleet.errors import ErrorCode
from planner.spec import Executor
from worker.api.common import service_of
from worker.api.errors import error_response

router = APIRouter()


def _model(service, name: str) -> dict:
    """OpenAI's model object, plus what this worker serves for it (the SDK ignores extras)."""
    return {
        "id": name,
        "object": "model",
        "created": service.created,
        "owned_by": "omni-fleet",
        "capabilities": service.capabilities.model_dump(mode="json"),
        "voices": list(service.builtin_voices),
        "engines": _engines(service),
    }


def _engines(service) -> list[dict]:
    """Each autoregressive stage's SGLang engine as the worker's plan started it (one pipeline
    replica; the others are alike): where it runs, its dtype, attention backend, tensor-parallel
    ranks and KV pool."""
    plan = getattr(service.pipeline, "node_plan", None)
    if plan is None:
        return []
    replicas = len(plan.replicas)
    out = []
    for process in plan.processes:
        if process.replica:
            continue
        for placed in process.stages:
            if service.spec.stages[placed.stage].executor != Executor.AUTOREGRESSIVE:
                continue
            engine = placed.engine
            gpus = ",".join(str(g) for g in process.gpus)
            out.append({
                "stage": placed.stage,
                "process": process.name,
                "device": f"gpu {gpus}" if gpus else "cpu",
                "dtype": placed.dtype,
                "attention_backend": None if engine is None else engine.attention_backend,
                "tensor_parallel_ranks": process.tp_size,
                "kv_tokens": placed.kv_tokens or None,
                "replicas": replicas,
            })  # fmt: skip
    return out


@router.get("/v1/models")
async def models(request: Request) -> dict:
    service = service_of(request)
    return {"object": "list", "data": [_model(service, m) for m in service.spec.served_models]}


@router.get("/v1/models/{name:path}")
async def model(name: str, request: Request) -> dict:
    service = service_of(request)
    service.check_model(name)
    return _model(service, name)


@router.get("/health")
@router.get("/live")
async def health(request: Request) -> dict:
    service = service_of(request)
    engine = service.pipeline.status()
    body = {
        "status": "alive",
        "worker_id": service.worker_id,
        "worker_status": service.status.value,
        "engine": {"ready": engine.ready, "healthy": engine.healthy, "detail": engine.detail},
    }
    # Stage process ids, when the engine exposes them: for operators and the restart test.
    pids = getattr(service.pipeline, "process_pids", None)
    if callable(pids):
        body["processes"] = pids()
    return body


@router.get("/ready")
async def ready(request: Request) -> Response:
    service = service_of(request)
    if service.serving:
        return Response(b'{"status":"ready"}', media_type="application/json")
    engine = service.pipeline.status()
    code = (
        ErrorCode.DRAINING if service.status.value == "draining" else ErrorCode.WORKER_UNAVAILABLE
    )
    detail = engine.detail if service.status.value == "ready" else service.detail
    return error_response(503, code, f"not ready: {service.status.value} ({detail})")


@router.get("/load")
async def load(request: Request) -> Response:
    return Response(
        service_of(request).load_report().model_dump_json(), media_type="application/json"
    )


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    service = service_of(request)
    service.load_report()  # refreshes the per-stage gauges
    return Response(service.metrics.render(), media_type=service.metrics.content_type)
