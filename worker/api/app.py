"""The FastAPI application of one worker."""

from __future__ import annotations

from fastapi import FastAPI

from worker.api import (
    audio,
    chat,
    completions,
    consents,
    errors,
    responses,
    speech,
    speech_stream,
    system,
    transcription,
    voices,
)
from worker.api.gate import Gate
from worker.api.limits import RequestLimits, max_prompt_bytes
from worker.api.realtime import endpoint as realtime
from worker.api.realtime.metrics import RealtimeMetrics
from worker.service import WorkerService


def create_app(service: WorkerService) -> FastAPI:
    app = FastAPI(
        title="omni-worker",
        version="0.1.0",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.service = service
    app.state.max_prompt_bytes = max_prompt_bytes(service.settings, service.spec)
    audio.configure_decoding(service.settings.audio_decode_threads)
    errors.install(app)
    for module in (
        system,
        chat,
        responses,
        completions,
        speech,
        speech_stream,
        transcription,
        voices,
        consents,
        realtime,
    ):
        app.include_router(module.router)
    RealtimeMetrics(service.metrics).export_at_zero()
    token = service.settings.token.get_secret_value() if service.settings.token else None
    app.add_middleware(
        Gate,
        token=token,
        max_body_bytes=service.settings.max_body_bytes,
        body_timeout=service.settings.body_timeout,
        metrics=service.metrics,
    )
    app.add_middleware(
        RequestLimits, max_audio_decoded_bytes=service.settings.max_audio_decoded_bytes
    )
    return app
