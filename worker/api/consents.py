"""Voice consents (OpenAI's ``audio.voice_consent``): the recording of a speaker agreeing to
voices cloned from their voice, uploaded once (``POST /v1/audio/voice_consents``: ``name``,
``language``, ``recording``), stored beside the voices (Redis: every worker sees it) and named
by its id when a voice is uploaded (``consent``: worker.api.voices checks that it exists and
that the same API key uploaded it). Listed with OpenAI's cursor (``after``, ``limit``),
renamed, deleted by the key that uploaded it."""

from __future__ import annotations

import hashlib
import re
import secrets

import numpy as np
from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile

from fleet.api_keys import API_KEY_ID_HEADER
from fleet.errors import ErrorCode, OmniError
from fleet.records import ConsentRecord
from worker.api import audio
from worker.api.common import read_form, service_of
from worker.api.voices import (
    SILENCE,
    VOICE_STORED_RATE,
    checked_name,
    consent_not_found,
    owned_consent,
    refuse_large_upload,
    require_voices,
)

router = APIRouter()

BCP47 = re.compile(r"[A-Za-z]{2,3}(-[A-Za-z0-9]{2,8}){0,3}")  # en, en-US, zh-Hant-TW
MAX_CONSENTS = 10_000  # in a fleet: each holds a recording of seconds
MAX_LIST = 100


def consent_json(record: ConsentRecord) -> dict:
    return {"object": "audio.voice_consent", "id": record.id, "name": record.name,
            "language": record.language, "created_at": int(record.created_at)}  # fmt: skip


@router.post("/v1/audio/voice_consents")
async def create_consent(request: Request) -> dict:
    service = service_of(request)
    require_voices(service)
    refuse_large_upload(request, service, "recording")
    form = await read_form(request)
    name = checked_name(form.get("name"))
    language = form.get("language")
    if not isinstance(language, str) or not BCP47.fullmatch(language):
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST,
            "field 'language' is required: the consent phrase's BCP 47 tag (en-US)", "language",
        )  # fmt: skip
    upload = form.get("recording")
    if not isinstance(upload, UploadFile):
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST, "field 'recording' (audio) is required", "recording"
        )
    settings = service.settings
    if (upload.size or 0) > settings.max_voice_upload_bytes:
        raise OmniError(
            413, ErrorCode.VOICE_TOO_LARGE,
            f"the recording is over {settings.max_voice_upload_bytes} bytes", "recording",
        )  # fmt: skip
    samples = await audio.decode_audio_async(
        await upload.read(),
        max_seconds=min(settings.max_voice_seconds, settings.max_audio_seconds),
        param="recording",
        target_rate=VOICE_STORED_RATE,
    )
    if not samples.size or float(np.abs(samples).max()) < SILENCE:
        raise audio.invalid_audio("the consent recording is silent", "recording")
    if len(await service.list_consents()) >= MAX_CONSENTS:
        raise OmniError(
            429, ErrorCode.VOICE_QUOTA_EXCEEDED,
            f"this fleet holds {MAX_CONSENTS} voice consents; delete one first", "recording",
        )  # fmt: skip
    pcm16 = audio.to_pcm16(samples)
    record = ConsentRecord(
        id="cons_" + secrets.token_hex(12),
        name=name,
        language=language,
        owner=request.headers.get(API_KEY_ID_HEADER, ""),
        bytes=len(pcm16),
        seconds=round(samples.size / VOICE_STORED_RATE, 3),
        sha256=hashlib.sha256(pcm16).hexdigest(),
    )
    await service.put_consent(record, pcm16)
    return consent_json(record)


@router.get("/v1/audio/voice_consents")
async def list_consents(request: Request) -> dict:
    service = service_of(request)
    after = request.query_params.get("after")
    raw_limit = request.query_params.get("limit", "20")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIST:
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST, f"limit: 1 to {MAX_LIST}", "limit"
        )  # fmt: skip
    records = await service.list_consents()
    if after:
        at = next((i for i, r in enumerate(records) if r.id == after), None)
        if at is None:
            raise consent_not_found(after, "after", 400)
        records = records[at + 1 :]
    page = records[: int(raw_limit)]
    return {
        "object": "list",
        "data": [consent_json(r) for r in page],
        "first_id": page[0].id if page else None,
        "last_id": page[-1].id if page else None,
        "has_more": len(records) > len(page),
    }


@router.get("/v1/audio/voice_consents/{consent_id}")
async def get_consent(consent_id: str, request: Request) -> dict:
    service = service_of(request)
    return consent_json(await owned_consent(service, request, consent_id, "consent_id"))


@router.post("/v1/audio/voice_consents/{consent_id}")
async def rename_consent(consent_id: str, request: Request) -> dict:
    service = service_of(request)
    record = await owned_consent(service, request, consent_id, "consent_id")
    try:
        body = await request.json()
    except ValueError as exc:
        raise OmniError(400, ErrorCode.INVALID_REQUEST, "the body is not JSON", None) from exc
    if not isinstance(body, dict) or set(body) - {"name"}:
        extra = sorted(set(body) - {"name"}) if isinstance(body, dict) else ["(body)"]
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST, f"only 'name' changes; not {extra[0]}", extra[0]
        )
    record = record.model_copy(update={"name": checked_name(body.get("name"))})
    await service.put_consent(record)
    return consent_json(record)


@router.delete("/v1/audio/voice_consents/{consent_id}")
async def delete_consent(consent_id: str, request: Request) -> dict:
    service = service_of(request)
    await owned_consent(service, request, consent_id, "consent_id")
    await service.delete_consent(consent_id)
    return {"object": "audio.voice_consent", "id": consent_id, "deleted": True}
