"""Uploaded reference voices: stored once in Redis (``FleetStore.put_voice``), so a voice
uploaded to any worker can be used on every worker."""

from __future__ import annotations

import hashlib
import re

import numpy as np
from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile

from fleet.errors import ErrorCode, OmniError
from fleet.records import Endpoint, VoiceRecord
from worker.api import audio
from worker.api.common import read_form, service_of
from worker.service import WorkerService

router = APIRouter()

VOICE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_VOICE_SECONDS = 60.0


def voice_not_found(name: str, builtin: list[str], param: str) -> OmniError:
    return OmniError(
        404,
        ErrorCode.VOICE_NOT_FOUND,
        f"voice {name!r} is neither built in ({', '.join(builtin) or 'none'}) nor uploaded "
        "(POST /v1/audio/voices)",
        param,
    )


async def resolve_voice(
    service: WorkerService, name: str, param: str
) -> tuple[str, np.ndarray | None]:
    """A built-in speaker, or an uploaded voice's reference audio fetched from the store."""
    builtin = service.engine.speakers()
    if name in builtin:
        return name, None
    found = await service.get_voice(name)
    if found is None:
        raise voice_not_found(name, builtin, param)
    _, data = found
    return name, audio.decode_audio(
        data, max_seconds=service.settings.max_audio_seconds, param=param
    )


def _voice_json(record: VoiceRecord) -> dict:
    return {"object": "voice", "builtin": False, **record.model_dump()}


def _require(service: WorkerService) -> None:
    if Endpoint.VOICES not in service.capabilities.endpoints:
        raise OmniError(
            404, ErrorCode.NOT_FOUND, f"model {service.spec.name!r} takes no uploaded voices"
        )


@router.get("/v1/audio/voices")
async def list_voices(request: Request) -> dict:
    service = service_of(request)
    builtin = [{"object": "voice", "name": n, "builtin": True} for n in service.engine.speakers()]
    uploaded = [_voice_json(r) for r in await service.list_voices()]
    return {"object": "list", "data": builtin + uploaded}


@router.post("/v1/audio/voices")
async def upload_voice(request: Request) -> dict:
    service = service_of(request)
    _require(service)
    form = await read_form(request)
    name = form.get("name")
    upload = form.get("file") or form.get("audio")
    if not isinstance(name, str) or not VOICE_NAME.match(name):
        raise OmniError(
            400,
            ErrorCode.INVALID_REQUEST,
            "field 'name' is required: 1-64 characters of letters, digits, '_', '.', '-'",
            "name",
        )
    if not isinstance(upload, UploadFile):
        raise OmniError(400, ErrorCode.INVALID_REQUEST, "field 'file' (audio) is required", "file")
    if name in service.engine.speakers():
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST, f"{name!r} is a built-in voice; pick another", "name"
        )
    data = await upload.read()
    max_seconds = min(MAX_VOICE_SECONDS, service.settings.max_audio_seconds)
    audio.decode_audio(data, max_seconds=max_seconds, param="file")  # refuse garbage up front
    record = VoiceRecord(
        name=name,
        bytes=len(data),
        content_type=upload.content_type or "audio/wav",
        uploaded_by=service.worker_id,
        sha256=hashlib.sha256(data).hexdigest(),
    )
    await service.put_voice(record, data)
    return _voice_json(record)


@router.get("/v1/audio/voices/{name}")
async def get_voice(name: str, request: Request) -> dict:
    service = service_of(request)
    if name in service.engine.speakers():
        return {"object": "voice", "name": name, "builtin": True}
    found = await service.get_voice(name)
    if found is None:
        raise voice_not_found(name, service.engine.speakers(), "name")
    return _voice_json(found[0])


@router.delete("/v1/audio/voices/{name}")
async def delete_voice(name: str, request: Request) -> dict:
    service = service_of(request)
    if name in service.engine.speakers():
        raise OmniError(400, ErrorCode.INVALID_REQUEST, f"{name!r} is built in", "name")
    if not await service.delete_voice(name):
        raise voice_not_found(name, service.engine.speakers(), "name")
    return {"object": "voice", "name": name, "deleted": True}


@router.delete("/v1/audio/voices")
async def delete_voice_by_query(request: Request) -> dict:
    name = request.query_params.get("name")
    if not name:
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST, "query parameter 'name' is required", "name"
        )
    return await delete_voice(name, request)
