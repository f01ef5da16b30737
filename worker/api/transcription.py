"""POST /v1/audio/transcriptions: a multipart audio file to text; POST /v1/audio/translations:
to English text (the families that translate: Qwen3-Omni's thinker, asked in words).

``response_format``: json, text, verbose_json (language, duration, segments), srt, vtt;
``stream=true``: server-sent events as OpenAI sends them (``transcript.text.delta`` events, then
``transcript.text.done``). Qwen3-ASR cuts long audio near pauses (clips of up to 1200 s, as the
official package cuts it): each clip is a segment, the text is the clips' texts joined, and the
language is the clips' detected languages in order ("Chinese,English"), or the hint.
``timestamp_granularities[]`` (verbose_json): ``segment`` (the clips, the default) and ``word``
(Qwen3-ForcedAligner's word times, on a spec with an aligner stage; clips are then cut at
180 s, as the official package cuts them for its aligner)."""

from __future__ import annotations

import numpy as np
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.datastructures import FormData, UploadFile

from fleet.errors import ErrorCode, OmniError, error_body
from fleet.records import Endpoint
from planner.spec import Executor
from worker.api import audio, languages
from worker.api.common import (
    closed_response,
    read_form,
    service_of,
    session_of,
)
from worker.api.errors import from_pydantic, stage_error
from worker.api.generation import Collected, collect_whole, events
from worker.api.replay import default_seed, reply_id
from worker.api.schemas import TranscriptionForm, TranslationForm
from worker.contract.options import TranscriptionOptions
from worker.contract.pipeline import (
    AUDIO_INPUT_RATE,
    Finished,
    GenerationRequest,
    RequestKind,
    StageFailed,
    TextDelta,
    merge_languages,
)
from worker.contract.sampling import Sampling
from worker.service import WorkerService

router = APIRouter()


def _form(
    form: FormData, model: type[TranslationForm]
) -> tuple[TranslationForm, UploadFile | None, list[str]]:
    """The form's fields as ``model``, its file, and its timestamp granularities. A list
    field comes as repeated ``name[]`` (the SDK's way) or ``name`` parts."""
    granularities = [
        v for k, v in form.multi_items() if k in _GRANULARITY_FIELDS and isinstance(v, str)
    ]
    lists: dict[str, list[str]] = {}
    fields: dict[str, object] = {}
    for k, v in form.multi_items():
        if k == "file" or k in _GRANULARITY_FIELDS or not isinstance(v, str):
            continue
        name = k.removesuffix("[]")
        if name in _LIST_FIELDS:
            lists.setdefault(name, []).append(v)
        else:
            fields[k] = v
    fields |= lists
    if granularities and model is TranslationForm:
        fields["timestamp_granularities"] = granularities[0]  # (refused: not a field of it)
    try:
        body = model.model_validate(fields)
    except ValidationError as exc:
        raise from_pydantic(exc) from exc
    upload = form.get("file")
    return body, upload if isinstance(upload, UploadFile) else None, granularities


async def _clip(service: WorkerService, upload: UploadFile | None) -> np.ndarray:
    if upload is None:
        raise OmniError(400, ErrorCode.INVALID_REQUEST, "field 'file' (audio) is required", "file")
    data = await upload.read()
    clip = await audio.decode_audio_async(
        data, max_seconds=service.settings.max_audio_seconds, param="file"
    )
    if clip.size == 0 or not np.isfinite(clip).all():
        raise OmniError(400, ErrorCode.INVALID_AUDIO, "audio has no samples", "file")
    return clip


def _generation(
    request: Request, clip: np.ndarray, body: TranslationForm, options: TranscriptionOptions
) -> GenerationRequest:
    task = "translation" if options.translate else "transcription"
    return GenerationRequest(
        request_id=reply_id(request, task),
        kind=RequestKind.TRANSCRIPTION,
        audio=clip,
        transcription=options,
        session_id=session_of(request),
        # (0 or unset: greedy)
        sampling=Sampling(temperature=body.temperature, seed=default_seed(request, None)),
    )


@router.post("/v1/audio/translations")
async def translations(request: Request) -> Response:
    service = service_of(request)
    body, upload, _ = _form(await read_form(request), TranslationForm)
    model = service.check_model(body.model)
    family = service.family
    if Endpoint.TRANSLATION not in service.capabilities.endpoints or not family.translates:
        raise OmniError(404, ErrorCode.NOT_FOUND, f"model {model!r} does not translate")
    clip = await _clip(service, upload)
    options = TranscriptionOptions(prompt=body.prompt or None, translate=True)
    gen = _generation(request, clip, body, options)
    ticket = service.admit(gen.session_id, RequestKind.TRANSCRIPTION)
    result = await collect_whole(request, service, gen, ticket)
    if result is None:
        return closed_response()
    text = "".join(result.text)
    duration = clip.size / AUDIO_INPUT_RATE
    segments = [(0.0, duration, text)] if text else []
    return _answer(body.response_format, "translate", text, "english", duration, segments, result)


@router.post("/v1/audio/transcriptions")
async def transcriptions(request: Request) -> Response:
    service = service_of(request)
    form, upload, granularities = _form(await read_form(request), TranscriptionForm)
    assert isinstance(form, TranscriptionForm)
    body = form
    model = service.check_model(body.model)
    if Endpoint.TRANSCRIPTION not in service.capabilities.endpoints:
        raise OmniError(404, ErrorCode.NOT_FOUND, f"model {model!r} does not transcribe")
    words = _check_granularities(service, body, granularities)
    timed = service.family.timed_transcripts
    language, prompt = _hint_and_context(body, timed)
    clip = await _clip(service, upload)
    options = TranscriptionOptions(language=language, prompt=prompt, timestamps=words)
    gen = _generation(request, clip, body, options)
    ticket = service.admit(gen.session_id, RequestKind.TRANSCRIPTION)
    duration = clip.size / AUDIO_INPUT_RATE
    if body.stream:
        return StreamingResponse(
            _sse(service, gen, ticket), media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )  # fmt: skip
    result = await collect_whole(request, service, gen, ticket)
    if result is None:
        return closed_response()
    texts = result.text
    text = "".join(texts)
    segments: list[tuple[float, float, str]] | None
    if timed:  # each clip's text is one delta, after its ClipStart
        detected = [c.language for c in result.clips]
        language = merge_languages(detected)
        pairs = zip(result.clips, texts, strict=True)
        segments = [(c.start, c.end, t.strip()) for c, t in pairs if t.strip()]
    else:
        detected = [options.language] if options.language else []
        language = options.language or ""
        segments = [(0.0, duration, text)] if text else []
    if "segment" not in granularities and granularities:
        segments = None  # (word timestamps only, as asked)
    return _answer(
        body.response_format,
        "transcribe",
        text,
        language or "unknown",
        duration,
        segments,
        result,
        result.words if words else None,
        languages.codes_of(detected) if body.languages is not None else None,
    )


def _hint_and_context(body: TranscriptionForm, timed: bool) -> tuple[str | None, str | None]:
    """The request's language hint and context for the model: ``language``, or the one
    language of ``languages`` (ISO-639-1); ``prompt`` then ``keywords`` (the model's own
    context: Qwen3-ASR's system turn, Qwen3-Omni's system message). What no family here does
    is refused, naming the field."""
    for field in ("known_speaker_names", "known_speaker_references"):
        if getattr(body, field):
            raise _refused(field, "speaker diarization is not served by these models")
    if body.include:
        raise _refused("include", "token log probabilities are not given for transcriptions")
    if body.chunking_strategy not in (None, "auto") or (body.chunking_strategy and not timed):
        raise _refused(
            "chunking_strategy",
            "only 'auto' is taken, by a model that cuts long audio at pauses itself (Qwen3-ASR)",
        )
    language = languages.hint(body.language) if body.language else None
    if body.languages:
        if len(body.languages) > 1 or language:
            raise _refused("languages", "give one language (the model's hint), or none")
        language = languages.name_of(body.languages[0])
        if language is None:
            known = ", ".join(sorted(languages.NAMES))
            raise _refused("languages", f"unknown ISO-639-1 code; known: {known}")
    context = [body.prompt or ""]
    if body.keywords:
        context.append("Keywords: " + ", ".join(k.strip() for k in body.keywords) + ".")
    prompt = "\n".join(c for c in context if c)
    if len(prompt) > 4096:
        raise _refused("keywords", "prompt and keywords come to more than 4096 characters")
    return language, prompt or None


def _refused(field: str, why: str) -> OmniError:
    return OmniError(400, ErrorCode.INVALID_REQUEST, f"{field}: {why}", field)


def _answer(
    fmt: str,
    task: str,
    text: str,
    language: str,
    duration: float,
    segments: list[tuple[float, float, str]] | None,
    result: Collected,
    words: list[tuple[str, float, float]] | None = None,
    detected: list[str] | None = None,
) -> Response:
    """A whole transcription or translation in ``response_format``; ``detected``: the
    languages heard (ISO-639-1 codes), answered as ``languages`` in json and verbose_json."""
    if fmt == "text":
        return PlainTextResponse(text)
    if fmt in ("srt", "vtt"):
        return PlainTextResponse(_subtitles(segments or [], fmt), media_type=_SUBTITLE_TYPES[fmt])
    payload: dict = {"text": text}
    if fmt == "verbose_json":
        payload |= {"task": task, "language": language, "duration": round(duration, 3)}
        if segments is not None:
            payload["segments"] = [
                {"id": i, "start": round(a, 3), "end": round(b, 3), "text": t}
                for i, (a, b, t) in enumerate(segments)
            ]
        if words is not None:
            payload["words"] = [{"word": w, "start": a, "end": b} for w, a, b in words]
    if detected is not None:
        payload["languages"] = detected
    if result.finished is not None:
        payload["usage"] = {
            "type": "tokens",
            "input_tokens": result.finished.prompt_tokens,
            "output_tokens": result.finished.completion_tokens,
            "total_tokens": result.finished.prompt_tokens + result.finished.completion_tokens,
        }
    return Response(orjson.dumps(payload), media_type="application/json")


_GRANULARITY_FIELDS = ("timestamp_granularities[]", "timestamp_granularities")
_LIST_FIELDS = {"keywords", "languages", "include", "known_speaker_names",
                "known_speaker_references"}  # fmt: skip
_SUBTITLE_TYPES = {"srt": "application/x-subrip", "vtt": "text/vtt"}


def _check_granularities(service, body: TranscriptionForm, granularities: list[str]) -> bool:
    """Whether word timestamps are wanted; every other use of the field is a clear 400."""
    param = "timestamp_granularities"
    unknown = sorted(set(granularities) - {"word", "segment"})
    if unknown:
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST,
            f"timestamp_granularities {unknown} unknown; use 'word' and/or 'segment'", param,
        )  # fmt: skip
    if granularities and body.response_format != "verbose_json":
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST,
            "timestamp_granularities needs response_format 'verbose_json'", param,
        )  # fmt: skip
    if "word" not in granularities:
        return False
    if body.stream:
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST, "word timestamps are not streamed; drop stream", param
        )
    stages = service.spec.stages.values()
    timed = service.family.timed_transcripts
    if not timed or not any(s.executor == Executor.ENCODER for s in stages):
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST,
            f"model {service.spec.name!r} has no forced aligner: word timestamps need a spec "
            "with a Qwen3-ForcedAligner stage (e.g. tiny-qwen3-asr)", param,
        )  # fmt: skip
    return True


def _stamp(seconds: float, sep: str) -> str:
    ms = round(seconds * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def _subtitles(segments: list[tuple[float, float, str]], fmt: str) -> str:
    if fmt == "srt":
        blocks = [
            f"{i + 1}\n{_stamp(a, ',')} --> {_stamp(b, ',')}\n{t}\n"
            for i, (a, b, t) in enumerate(segments)
        ]
        return "\n".join(blocks)
    cues = [f"{_stamp(a, '.')} --> {_stamp(b, '.')}\n{t}\n" for a, b, t in segments]
    return "WEBVTT\n\n" + "\n".join(cues)


async def _sse(service, gen: GenerationRequest, ticket):
    texts: list[str] = []
    finished = None
    try:
        async with events(service, gen) as stream:
            async for event in stream:
                if isinstance(event, TextDelta):
                    ticket.text()
                    if not event.text:
                        continue
                    texts.append(event.text)
                    payload = {"type": "transcript.text.delta", "delta": event.text}
                    yield b"data: " + orjson.dumps(payload) + b"\n\n"
                elif isinstance(event, Finished):
                    finished = event
        done: dict = {"type": "transcript.text.done", "text": "".join(texts)}
        if finished is not None:
            done["usage"] = {
                "type": "tokens",
                "input_tokens": finished.prompt_tokens,
                "output_tokens": finished.completion_tokens,
                "total_tokens": finished.prompt_tokens + finished.completion_tokens,
            }
        yield b"data: " + orjson.dumps(done) + b"\n\n"
    except StageFailed as exc:
        yield b"data: " + orjson.dumps(error_body(*stage_error(exc))) + b"\n\n"
    finally:
        ticket.release()
