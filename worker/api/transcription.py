"""POST /v1/audio/transcriptions: a multipart audio file to text."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from fleet.errors import ErrorCode, OmniError
from fleet.records import Endpoint
from worker.api import audio
from worker.api.common import (
    closed_response,
    new_id,
    read_form,
    service_of,
    session_of,
    until_disconnect,
)
from worker.api.errors import from_pydantic
from worker.api.generation import collect
from worker.api.schemas import TranscriptionForm
from worker.engine import AUDIO_INPUT_RATE, GenerationRequest, RequestKind

router = APIRouter()


@router.post("/v1/audio/transcriptions")
async def transcriptions(request: Request) -> Response:
    service = service_of(request)
    form = await read_form(request)
    upload = form.get("file")
    fields = {k: v for k, v in form.multi_items() if k != "file" and isinstance(v, str)}
    fields.pop("timestamp_granularities[]", None)  # accepted by the SDK, not produced here
    try:
        body = TranscriptionForm.model_validate(fields)
    except ValidationError as exc:
        raise from_pydantic(exc) from exc
    model = service.check_model(body.model)
    if Endpoint.TRANSCRIPTION not in service.capabilities.endpoints:
        raise OmniError(404, ErrorCode.NOT_FOUND, f"model {model!r} does not transcribe")
    if not isinstance(upload, UploadFile):
        raise OmniError(400, ErrorCode.INVALID_REQUEST, "field 'file' (audio) is required", "file")
    data = await upload.read()
    clip = await audio.decode_audio_async(
        data, max_seconds=service.settings.max_audio_seconds, param="file"
    )
    session = session_of(request)
    ticket = service.admit(session)
    gen = GenerationRequest(
        request_id=new_id("transcription"),
        kind=RequestKind.TRANSCRIPTION,
        messages=[{"role": "user", "content": body.prompt or ""}] if body.prompt else [],
        audio=clip,
        session_id=session,
    )
    try:
        result = await until_disconnect(request, collect(service, gen, ticket))
    finally:
        ticket.release()
    if result is None:
        return closed_response()
    text = "".join(result.text)
    if body.response_format == "text":
        return PlainTextResponse(text)
    payload: dict = {"text": text}
    if body.response_format == "verbose_json":
        payload |= {
            "task": "transcribe",
            "language": body.language or "unknown",
            "duration": round(clip.size / AUDIO_INPUT_RATE, 3),
            "segments": [],
        }
    if result.finished is not None:
        payload["usage"] = {
            "type": "tokens",
            "input_tokens": result.finished.prompt_tokens,
            "output_tokens": result.finished.completion_tokens,
            "total_tokens": result.finished.prompt_tokens + result.finished.completion_tokens,
        }
    return Response(orjson.dumps(payload), media_type="application/json")
