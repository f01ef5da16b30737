"""Uploaded reference voices: stored once in Redis (``FleetStore.put_voice``), so a voice
uploaded to any worker can be used on every worker.

A voice is stored in the form the model takes (mono 24 kHz pcm16, at most
``--max-voice-seconds``), never as uploaded: a 30 MB 8-channel wav costs what its seconds of
speech cost. The fleet's total and each API key's share are quotas kept atomically in Redis."""

from __future__ import annotations

import asyncio
import hashlib
import re

import numpy as np
from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile

from fleet.api_keys import API_KEY_ID_HEADER
from fleet.errors import ErrorCode, OmniError
from fleet.records import PCM16_24K, PROMPT_UTF8, ConsentRecord, Endpoint, VoiceRecord
from fleet.store import VoiceOwnedByAnotherKey, VoiceQuotaExceeded
from worker.api import audio
from worker.api.common import media_type, read_form, read_json_object, service_of
from worker.contract.pipeline import AUDIO_INPUT_RATE, AUDIO_OUTPUT_RATE
from worker.service import WorkerService

router = APIRouter()

VOICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # whole name: use fullmatch
VOICE_STORED_RATE = AUDIO_OUTPUT_RATE  # Hz: the codec's rate, what speaker encoders take
VOICE_REFERENCE_RATE = AUDIO_INPUT_RATE  # Hz: the rate GenerationRequest.voice_audio has
SILENCE = 1e-4  # peak below this (float, full scale 1.0): a silent reference, refused
MAX_TRANSCRIPT_CHARS = 2048
MAX_PROMPT_CHARS = 2048  # a designed voice's description
PROMPT_VOICE = "prompt"  # OpenAI's ``type`` of a voice designed from words
# the fields OpenAI defines for a voice's creation: a designed voice takes name, type, prompt
# and model, and refuses the others by name
_DESIGNED_VOICE_FIELDS = frozenset(
    {"name", "type", "prompt", "model", "script_hint", "audio_sample", "file", "consent"}
)
_MULTIPART_SLACK = 64 * 1024  # a voice upload's body beyond its file: boundaries, name field


def checked_name(value: object) -> str:
    """A voice's or a consent's ``name`` field, or the 400 naming it."""
    if not isinstance(value, str) or not VOICE_NAME.fullmatch(value):
        raise OmniError(
            400,
            ErrorCode.INVALID_REQUEST,
            "field 'name' is required: 1-64 characters of letters, digits, '_', '.', '-'",
            "name",
        )
    return value


def voice_not_found(name: str, builtin: list[str], param: str, status: int = 404) -> OmniError:
    """Unknown voice: 404 where the voice is the resource (``/v1/audio/voices/{name}``), 400
    where it is a request's parameter (speech, chat audio), as issue 10 asks of bad input."""
    return OmniError(
        status,
        ErrorCode.VOICE_NOT_FOUND,
        f"voice {name!r} is neither built in ({', '.join(builtin) or 'none'}) nor uploaded "
        "(POST /v1/audio/voices)",
        param,
    )


async def resolve_voice(
    service: WorkerService, name: str, param: str, rate: int | None = None
) -> tuple[str, np.ndarray | None]:
    """A built-in speaker, or an uploaded voice's reference audio fetched from the store, at
    ``rate`` (default: the rate the engine takes reference audio at). A voice designed from a
    prompt is refused: only the speech endpoint of a VoiceDesign model speaks one."""
    voice, samples, record = await resolve_voice_record(service, name, param, rate)
    if record is not None and record.type == PROMPT_VOICE:
        raise designed_voice_unserved(service, name, param)
    return voice, samples


def designed_voice_unserved(service: WorkerService, name: str, param: str) -> OmniError:
    return OmniError(
        400,
        ErrorCode.INVALID_REQUEST,
        f"voice {name!r} is designed from words (type 'prompt'): only /v1/audio/speech of a "
        f"model that designs voices (Qwen3-TTS VoiceDesign) speaks it, not {service.spec.name!r}"
        " here",
        param,
    )


async def resolve_voice_record(
    service: WorkerService, name: str, param: str, rate: int | None = None
) -> tuple[str, np.ndarray | None, VoiceRecord | None]:
    """``resolve_voice`` plus the uploaded voice's record (None for a built-in speaker), read in
    the same fetch: its transcript and content hash belong to exactly these samples."""
    rate = rate or VOICE_REFERENCE_RATE
    speaker = service.builtin_voices.get(name)
    if speaker is not None:  # (an alias speaks as its speaker)
        return speaker, None, None
    found = await service.get_voice(name)
    if found is None:
        raise voice_not_found(name, list(service.builtin_voices), param, status=400)
    record, data = found
    if record.type == PROMPT_VOICE:
        return name, None, record  # (the caller speaks its prompt, or refuses it)
    if not record.sha256:
        record = record.model_copy(update={"sha256": hashlib.sha256(data).hexdigest()})
    if record.format == PCM16_24K:
        loop = asyncio.get_running_loop()
        return name, await loop.run_in_executor(None, reference_audio, data, rate), record
    # stored as uploaded (before voices were converted on upload)
    samples = await audio.decode_audio_async(
        data,
        max_seconds=service.settings.max_audio_seconds,
        param=param,
        target_rate=rate,
    )
    return name, samples, record


def reference_audio(pcm16: bytes, rate: int = VOICE_REFERENCE_RATE) -> np.ndarray:
    """A stored voice -> float32 at ``rate``."""
    samples = audio.from_pcm16(pcm16)
    return (
        samples if rate == VOICE_STORED_RATE else audio.resample(samples, VOICE_STORED_RATE, rate)
    )


def _voice_json(record: VoiceRecord) -> dict:
    """OpenAI's ``audio.voice`` object (id, name, type, created_at in seconds), with what the
    fleet keeps of an uploaded voice beside it."""
    if record.type == PROMPT_VOICE:  # (no audio: OpenAI shows its prompt instead)
        shown = record.model_dump(include={"name", "bytes", "uploaded_by", "type", "prompt"})
    else:
        shown = record.model_dump(exclude={"owner", "format", "created_at", "prompt"})
    return {"object": "audio.voice", "id": record.name, "builtin": False,
            "created_at": int(record.created_at), **shown}  # fmt: skip


def _builtin_json(name: str, speaker: str) -> dict:
    """A built-in speaker as an ``audio.voice`` (created with the checkpoint: at 0)."""
    shown = {"object": "audio.voice", "id": name, "name": name, "type": "builtin",
             "builtin": True, "created_at": 0}  # fmt: skip
    if speaker != name:  # an alias (the spec's voice_aliases): the speaker it speaks as
        shown["alias_of"] = speaker
    return shown


def consent_not_found(consent_id: str, param: str, status: int = 404) -> OmniError:
    return OmniError(
        status,
        ErrorCode.NOT_FOUND,
        f"no voice consent {consent_id!r}: upload the speaker's consent recording first "
        "(POST /v1/audio/voice_consents)",
        param,
    )


async def owned_consent(service: WorkerService, request: Request, consent_id: str,
                        param: str, status: int = 404) -> ConsentRecord:  # fmt: skip
    """The consent, if it exists and the caller's API key (if any) uploaded it."""
    record = await service.get_consent(consent_id)
    if record is None:
        raise consent_not_found(consent_id, param, status)
    owner = request.headers.get(API_KEY_ID_HEADER, "")
    if owner and record.owner not in ("", owner):
        raise OmniError(
            403,
            ErrorCode.PERMISSION_DENIED,
            f"voice consent {consent_id!r} was uploaded with another API key",
            param,
        )
    return record


def _voice_too_large(size: int, limit: int, param: str = "file") -> OmniError:
    return OmniError(
        413,
        ErrorCode.VOICE_TOO_LARGE,
        f"voice upload is {size} bytes; this worker takes files of at most {limit} bytes (a "
        "voice needs only a few seconds of speech)",
        param,
    )


def _owned_error(name: str) -> OmniError:
    return OmniError(
        403,
        ErrorCode.PERMISSION_DENIED,
        f"voice {name!r} was uploaded with another API key; only that key may replace or delete it",
        "name",
    )


def _quota_error(exc: VoiceQuotaExceeded) -> OmniError:
    whose = "this fleet's" if exc.scope == "fleet" else "this API key's"
    return OmniError(
        429,
        ErrorCode.VOICE_QUOTA_EXCEEDED,
        f"{whose} uploaded voices use {exc.used} of {exc.limit} bytes; delete a voice "
        "(DELETE /v1/audio/voices/{name}) before uploading another",
        "file",
    )


def refuse_large_upload(request: Request, service: WorkerService, param: str) -> None:
    """413 before a byte of the body is read, when its declared length is over the limit."""
    declared = request.headers.get("content-length", "")
    limit = service.settings.max_voice_upload_bytes
    if declared.isdigit() and int(declared) > limit + _MULTIPART_SLACK:
        raise _voice_too_large(int(declared), limit, param)


def require_voices(service: WorkerService) -> None:
    if Endpoint.VOICES not in service.capabilities.endpoints:
        raise OmniError(
            404, ErrorCode.NOT_FOUND, f"model {service.spec.name!r} takes no uploaded voices"
        )


@router.get("/v1/audio/voices")
async def list_voices(request: Request) -> dict:
    service = service_of(request)
    builtin = [_builtin_json(n, s) for n, s in service.builtin_voices.items()]
    uploaded = [_voice_json(r) for r in await service.list_voices()]
    return {"object": "list", "data": builtin + uploaded}


@router.post("/v1/audio/voices")
async def upload_voice(request: Request) -> dict:
    service = service_of(request)
    require_voices(service)
    if (model := request.query_params.get("model")) is not None:  # what a router routed on
        service.check_model(model)
    refuse_large_upload(request, service, "file")
    if media_type(request) == "application/json":  # (OpenAI takes a prompt voice as JSON too)
        fields = await read_json_object(request)
        if fields.get("type") != PROMPT_VOICE:
            raise OmniError(
                400, ErrorCode.INVALID_REQUEST,
                "a voice cloned from audio is sent as multipart/form-data; JSON creates only "
                "a voice designed from words (type 'prompt')", "type",
            )  # fmt: skip
        return await create_designed_voice(service, request, fields)
    form = await read_form(request)
    kind = form.get("type") or "audio_sample"
    if kind == PROMPT_VOICE:
        return await create_designed_voice(service, request, dict(form))
    if kind != "audio_sample":
        raise OmniError(
            400,
            ErrorCode.INVALID_REQUEST,
            f"field 'type' is 'audio_sample' (a voice cloned from audio) or {PROMPT_VOICE!r} (a "
            "voice designed from words)",
            "type",
        )
    name = form.get("name")
    # `audio_sample` is OpenAI's name (the SDK's audio.voices.create sends it)
    upload = form.get("audio_sample") or form.get("file") or form.get("audio")
    name = checked_name(name)
    if not isinstance(upload, UploadFile):
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST, "field 'file' or 'audio_sample' is required", "file"
        )
    consent = form.get("consent") or ""
    if not isinstance(consent, str) or len(consent) > 256:
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST, "field 'consent' is a voice consent's id", "consent"
        )
    if consent:  # (a consent the same key uploaded: POST /v1/audio/voice_consents)
        await owned_consent(service, request, consent, "consent", status=400)
    if name in service.builtin_voices:
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST, f"{name!r} is a built-in voice; pick another", "name"
        )
    settings = service.settings
    if (upload.size or 0) > settings.max_voice_upload_bytes:
        raise _voice_too_large(upload.size or 0, settings.max_voice_upload_bytes)
    data = await upload.read()
    samples = await audio.decode_audio_async(
        data,
        max_seconds=min(settings.max_voice_seconds, settings.max_audio_seconds),
        param="file",
        target_rate=VOICE_STORED_RATE,
    )
    if samples.size and float(np.abs(samples).max()) < SILENCE:
        raise audio.invalid_audio("the voice's audio is silent: nothing to clone", "file")
    transcript = form.get("text") or form.get("transcript") or ""
    if not isinstance(transcript, str) or len(transcript) > MAX_TRANSCRIPT_CHARS:
        raise OmniError(
            400,
            ErrorCode.INVALID_REQUEST,
            f"field 'text' (what the voice says) must be text of at most {MAX_TRANSCRIPT_CHARS} "
            "characters",
            "text",
        )
    pcm16 = audio.to_pcm16(samples)
    record = VoiceRecord(
        name=name,
        bytes=len(pcm16),
        content_type=f"audio/pcm;rate={VOICE_STORED_RATE};encoding=s16le",
        uploaded_by=service.worker_id,
        sha256=hashlib.sha256(pcm16).hexdigest(),
        format=PCM16_24K,
        owner=request.headers.get(API_KEY_ID_HEADER, ""),
        seconds=round(samples.size / VOICE_STORED_RATE, 3),
        transcript=transcript.strip(),
        consent=consent,
    )
    return await _stored(service, record, pcm16)


async def _stored(service: WorkerService, record: VoiceRecord, data: bytes) -> dict:
    """Store a voice in the fleet (within the quotas, as its owner's): its ``audio.voice``."""
    try:
        await service.put_voice(record, data)
    except VoiceQuotaExceeded as exc:
        raise _quota_error(exc) from exc
    except VoiceOwnedByAnotherKey as exc:
        raise _owned_error(record.name) from exc
    return _voice_json(record)


async def create_designed_voice(
    service: WorkerService, request: Request, fields: dict[str, object]
) -> dict:
    """OpenAI's ``type: "prompt"``: a voice that words describe, stored in the fleet like an
    upload, then spoken by a VoiceDesign model with its prompt as the voice's description."""
    if service.pipeline.designed_voice() is None:
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST,
            f"model {service.spec.name!r} cannot design a voice from words (type "
            f"{PROMPT_VOICE!r} needs a Qwen3-TTS VoiceDesign model; through a router, name "
            "one with ?model=)", "type",
        )  # fmt: skip
    unknown = sorted(set(fields) - _DESIGNED_VOICE_FIELDS)
    if unknown:  # (refused, not ignored)
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST,
            f"field {unknown[0]!r} is not one of a designed voice's: "
            f"{', '.join(sorted(_DESIGNED_VOICE_FIELDS))}", unknown[0],
        )  # fmt: skip
    name = checked_name(fields.get("name"))
    prompt = fields.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST,
            f"field 'prompt' (words that describe the voice) must be text of 1 to "
            f"{MAX_PROMPT_CHARS} characters, not only whitespace", "prompt",
        )  # fmt: skip
    for field, why in (
        ("audio_sample", "a designed voice takes no audio (type 'audio_sample' clones one)"),
        ("file", "a designed voice takes no audio (type 'audio_sample' clones one)"),
        ("consent", "a designed voice is no one's: it takes no consent"),
        ("script_hint", "no audio is made when a voice is designed: the voice is designed "
         "anew from its prompt each time it speaks"),
    ):  # fmt: skip
        if fields.get(field) not in (None, ""):
            raise OmniError(400, ErrorCode.INVALID_REQUEST, f"field {field!r}: {why}", field)
    model = fields.get("model")
    if model not in (None, "", "auto", service.spec.name):
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST,
            f"field 'model' is 'auto' or this worker's model {service.spec.name!r}", "model",
        )  # fmt: skip
    if name in service.builtin_voices:
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST, f"{name!r} is a built-in voice; pick another", "name"
        )
    data = prompt.strip().encode()
    record = VoiceRecord(
        name=name,
        bytes=len(data),
        content_type="text/plain;charset=utf-8",
        uploaded_by=service.worker_id,
        sha256=hashlib.sha256(data).hexdigest(),
        format=PROMPT_UTF8,
        owner=request.headers.get(API_KEY_ID_HEADER, ""),
        type=PROMPT_VOICE,
        prompt=prompt.strip(),
    )
    return await _stored(service, record, data)


@router.get("/v1/audio/voices/{name}")
async def get_voice(name: str, request: Request) -> dict:
    service = service_of(request)
    if name in service.builtin_voices:
        return _builtin_json(name, service.builtin_voices[name])
    found = await service.get_voice(name)
    if found is None:
        raise voice_not_found(name, list(service.builtin_voices), "name")
    return _voice_json(found[0])


@router.delete("/v1/audio/voices/{name}")
async def delete_voice(name: str, request: Request) -> dict:
    service = service_of(request)
    if name in service.builtin_voices:
        raise OmniError(400, ErrorCode.INVALID_REQUEST, f"{name!r} is built in", "name")
    try:
        deleted = await service.delete_voice(name, request.headers.get(API_KEY_ID_HEADER, ""))
    except VoiceOwnedByAnotherKey as exc:
        raise _owned_error(name) from exc
    if not deleted:
        raise voice_not_found(name, list(service.builtin_voices), "name")
    return {"object": "audio.voice.deleted", "id": name, "name": name, "deleted": True}


@router.delete("/v1/audio/voices")
async def delete_voice_by_query(request: Request) -> dict:
    name = request.query_params.get("name")
    if not name:
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST, "query parameter 'name' is required", "name"
        )
    return await delete_voice(name, request)
