"""POST /v1/audio/speech: text to speech as a whole wav/pcm file, or streamed while the
vocoder produces it (``stream_format: "audio"`` or ``stream: true``: chunked transfer;
``stream_format: "sse"``: ``speech.audio.delta`` events)."""

from __future__ import annotations

import base64

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from fleet.errors import ErrorCode, OmniError, error_body
from fleet.records import Endpoint
from worker.api import audio
from worker.api.common import (
    TrackedStream,
    closed_response,
    new_id,
    read_json,
    service_of,
    session_of,
    until_disconnect,
)
from worker.api.errors import stage_error
from worker.api.generation import collect, events
from worker.api.schemas import SpeechRequest
from worker.api.voices import resolve_voice
from worker.engine import AudioChunk, Finished, GenerationRequest, RequestKind, StageFailed
from worker.service import Ticket, WorkerService

router = APIRouter()


@router.post("/v1/audio/speech")
async def speech(request: Request) -> Response:
    service = service_of(request)
    body = await read_json(request, SpeechRequest)
    model = service.check_model(body.model)
    if Endpoint.SPEECH not in service.capabilities.endpoints:
        raise OmniError(404, ErrorCode.NOT_FOUND, f"model {model!r} does not serve speech")
    session = session_of(request)
    ticket = service.admit(session)
    try:
        voice, voice_audio = await resolve_voice(service, body.voice, "voice")
    except BaseException:
        ticket.release()
        raise
    gen = GenerationRequest(
        request_id=new_id("speech"),
        kind=RequestKind.SPEECH,
        text=body.input,
        output_audio=True,
        voice=voice,
        voice_audio=voice_audio,
        session_id=session,
    )
    fmt = body.response_format
    if body.stream_format == "sse":
        return TrackedStream(
            _sse_stream(service, gen, ticket),
            ticket,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    if body.stream or body.stream_format == "audio":
        return TrackedStream(
            _audio_stream(service, gen, ticket, fmt),
            ticket,
            media_type=audio.media_type(fmt),
            headers={"X-Accel-Buffering": "no"},
        )
    try:
        result = await until_disconnect(request, collect(service, gen, ticket))
    finally:
        ticket.release()
    if result is None:
        return closed_response()
    return Response(audio.encode(bytes(result.pcm16), fmt), media_type=audio.media_type(fmt))


async def _audio_stream(service: WorkerService, gen: GenerationRequest, ticket: Ticket, fmt: str):
    done = False
    try:
        if fmt == "wav":
            yield audio.wav_header(None)
        async with events(service, gen) as stream:
            async for event in stream:
                if isinstance(event, AudioChunk) and event.pcm16:
                    ticket.audio()
                    service.metrics.audio_out.inc(audio.pcm16_seconds(event.pcm16))
                    yield event.pcm16
        done = True
    finally:
        if not done:
            service.metrics.aborted.inc()
    # A StageFailed escapes here on purpose: the server then cuts the chunked body, so the
    # client sees a truncated transfer instead of a short file that looks complete.


async def _sse_stream(service: WorkerService, gen: GenerationRequest, ticket: Ticket):
    done = False
    finished = Finished("stop")
    try:
        async with events(service, gen) as stream:
            async for event in stream:
                if isinstance(event, AudioChunk) and event.pcm16:
                    ticket.audio()
                    service.metrics.audio_out.inc(audio.pcm16_seconds(event.pcm16))
                    data = base64.b64encode(event.pcm16).decode()
                    yield b"data: " + orjson.dumps({"type": "speech.audio.delta", "audio": data})
                    yield b"\n\n"
                elif isinstance(event, Finished):
                    finished = event
        usage = {
            "input_tokens": finished.prompt_tokens,
            "output_tokens": finished.completion_tokens,
        }
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        yield b"data: " + orjson.dumps({"type": "speech.audio.done", "usage": usage}) + b"\n\n"
        done = True
    except StageFailed as exc:
        payload = error_body(*stage_error(exc))
        yield b"data: " + orjson.dumps(payload) + b"\n\n"
        done = True
    finally:
        if not done:
            service.metrics.aborted.inc()
