"""POST /v1/audio/speech: text to speech as a whole file (wav, pcm, mp3, flac, opus, aac, and
G.711 mulaw / alaw), or streamed while the vocoder produces it (``stream_format: "audio"`` or
``stream: true``: chunked transfer, encoded incrementally; ``stream_format: "sse"``:
``speech.audio.delta`` events, each the next bytes of the response format, raw pcm16 for wav).
``sample_rate`` resamples (worker.api.speech_formats); ``speed`` is applied as a tempo change
(pitch kept); ``instructions`` and ``language`` reach models that take them (Qwen3-TTS) and are
refused (400) by the others. ``word_timestamps`` (specs with an aligner stage): the words of the
synthesized speech with their times in seconds of the audio as sent (``speed`` applied), in
the ``X-Word-Timestamps`` header (JSON, ASCII) of a whole response or a
``speech.audio.word_timestamps`` event before ``speech.audio.done``.

POST /v1/audio/speech/batch: several inputs in one request, generated together by the engine
(their talker steps run as one batch); the answer lists each input's audio, base64-encoded."""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import HTTPConnection

from fleet.errors import ErrorCode, OmniError, error_body
from fleet.records import Endpoint
from worker.api import audio, speech_formats
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
from worker.api.generation import collect, collect_whole, events
from worker.api.replay import default_seed
from worker.api.schemas import SpeechBatchRequest, SpeechRequest, SpeechSampling
from worker.api.voices import PROMPT_VOICE, designed_voice_unserved, resolve_voice_record
from worker.contract.options import SpeechOptions
from worker.contract.pipeline import (
    AudioChunk,
    Finished,
    GenerationRequest,
    RequestKind,
    StageFailed,
    WordTimings,
)
from worker.contract.sampling import Sampling
from worker.service import Ticket, WorkerService

router = APIRouter()


async def speech_generation(
    service: WorkerService,
    text: str,
    voice_name: str,
    instructions: str | None,
    language: str | None,
    param: str = "voice",
) -> GenerationRequest:
    """The engine request that speaks ``text``: the voice resolved (built-in or cloned), and
    Qwen3-TTS's instructions and language as its options."""
    family = service.family
    if not family.speech_options:
        for field, given in (("instructions", instructions), ("language", language)):
            if given:  # (refused, not ignored)
                raise OmniError(
                    400, ErrorCode.INVALID_REQUEST,
                    f"model {service.spec.name!r} speaks without {field}: only Qwen3-TTS "
                    "models take it", field,
                )  # fmt: skip
    elif instructions and not service.pipeline.follows_instructions():
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST,
            f"model {service.spec.name!r} does not follow instructions (its checkpoint cannot: "
            f"the official package drops them there): send none, or serve {family.instructed}",
            "instructions",
        )  # fmt: skip
    voice, voice_audio, record = await resolve_voice_record(
        service, voice_name, param, rate=family.voice_rate
    )
    if record is not None and record.type == PROMPT_VOICE:
        # a voice designed from words: the checkpoint's designed voice, described by its
        # prompt, then by the request's instructions (how to speak) after it
        designed = service.pipeline.designed_voice()
        if designed is None:
            raise designed_voice_unserved(service, voice_name, param)
        instructions = "\n".join(filter(None, (record.prompt, instructions)))
        voice, record = designed, None
    options = None
    if family.speech_options:
        options = SpeechOptions(
            language=language or None,
            instructions=instructions or None,
            # the voice's content hash: its reference codes and speaker embedding are
            # computed once per voice in the stages (worker.models.qwen3_tts.voice_cache)
            ref_text=record.transcript if record is not None else None,
            voice_key=record.sha256 if record is not None else None,
        )
    return GenerationRequest(
        request_id=new_id("speech"),
        kind=RequestKind.SPEECH,
        text=text,
        output_audio=True,
        voice=voice,
        voice_audio=voice_audio,
        speech=options,
    )


@router.post("/v1/audio/speech")
async def speech(request: Request) -> Response:
    service = service_of(request)
    body = await read_json(request, SpeechRequest)
    service.check_serves(body.model, Endpoint.SPEECH)
    if not body.input.strip():
        raise OmniError(400, ErrorCode.INVALID_REQUEST, "input is blank", "input")
    fmt = body.response_format
    rate = speech_formats.output_rate(fmt, body.sample_rate)
    streamed = body.stream or body.stream_format == "audio"
    check_word_timestamps(service, body.word_timestamps, streamed and body.stream_format != "sse")
    gen, ticket = await admitted_speech(
        service, session_of(request), body.input, body.voice, body.instructions, body.language
    )
    gen.speech_sampling = speech_sampling(request, body)
    gen.word_timestamps = body.word_timestamps
    if body.stream_format == "sse":
        return TrackedStream(
            _sse_stream(service, gen, ticket, fmt, body.speed, rate),
            ticket,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    if streamed:
        return TrackedStream(
            _audio_stream(service, gen, ticket, fmt, body.speed, rate),
            ticket,
            media_type=speech_formats.media_type(fmt),
            headers={"X-Accel-Buffering": "no"},
        )
    result = await collect_whole(request, service, gen, ticket)
    if result is None:
        return closed_response()
    headers = {}
    if body.word_timestamps:  # (JSON's ASCII escapes: a header value is latin-1)
        words = word_entries(result.words, body.speed)
        headers["X-Word-Timestamps"] = json.dumps(words, separators=(",", ":"))
    return Response(
        whole_audio(bytes(result.pcm16), fmt, body.speed, rate),
        media_type=speech_formats.media_type(fmt),
        headers=headers,
    )


def check_word_timestamps(service: WorkerService, asked: bool, raw_stream: bool) -> None:
    """``word_timestamps`` is refused (400) where the spec cannot time words, and on a raw
    audio stream (nothing after the audio could carry them)."""
    if not asked:
        return
    if not service.times_speech_words:
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST,
            f"model {service.spec.name!r} has no aligner stage to time the words of its speech "
            "(serve a spec with one, such as qwen3-tts-12hz-0.6b-aligned)", "word_timestamps",
        )  # fmt: skip
    if raw_stream:
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST,
            "word_timestamps come with a whole response (the X-Word-Timestamps header) or "
            "with stream_format sse, not on a raw audio stream", "word_timestamps",
        )  # fmt: skip


def word_entries(words: list[tuple[str, float, float]], speed: float) -> list[dict[str, Any]]:
    """The aligner's words as the client hears them: times in the audio as sent (its tempo
    changed by ``speed``)."""
    return [
        {"word": w, "start": round(start / speed, 3), "end": round(end / speed, 3)}
        for w, start, end in words
    ]


async def admitted_speech(
    service: WorkerService,
    session: str | None,
    text: str,
    voice: str,
    instructions: str | None,
    language: str | None,
) -> tuple[GenerationRequest, Ticket]:
    """A speech request admitted on this worker (its ticket released if it cannot be made)."""
    ticket = service.admit(session, RequestKind.SPEECH)
    try:
        gen = await speech_generation(service, text, voice, instructions, language)
    except BaseException:
        ticket.release()
        raise
    gen.session_id = session
    return gen, ticket


def speech_sampling(request: HTTPConnection, body: SpeechSampling, index: int = 0) -> Sampling:
    """The talker's sampling as the request asks (unset: the checkpoint's), always seeded: by
    the request's seed, else one derived from the router's request id (a replay after a
    failover is the same audio), else a random one; a batch's item ``index`` adds its index."""
    seed = default_seed(request, body.seed)
    return Sampling(
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        repetition_penalty=body.repetition_penalty,
        seed=(secrets.randbits(62) if seed is None else seed) + index,
    )


def whole_audio(pcm16: bytes, fmt: str, speed: float, rate: int) -> bytes:
    out = speech_formats.Output(fmt, speed, rate)
    data = out.feed(pcm16) + out.close()
    return audio.wav_header(len(data), rate) + data if fmt == "wav" else data


@router.post("/v1/audio/speech/batch")
async def speech_batch(request: Request) -> Response:
    import asyncio

    service = service_of(request)
    body = await read_json(request, SpeechBatchRequest)
    service.check_serves(body.model, Endpoint.SPEECH)
    fmt = body.response_format
    rate = speech_formats.output_rate(fmt, body.sample_rate)
    gens = []
    for i, item in enumerate(body.inputs):
        if not item.input.strip():
            raise OmniError(400, ErrorCode.INVALID_REQUEST, "input is blank", f"inputs.{i}.input")
        voice = item.voice or body.voice
        if voice is None:
            raise OmniError(
                400, ErrorCode.INVALID_REQUEST, "no voice (per input or for the batch)",
                f"inputs.{i}.voice",
            )  # fmt: skip
        gens.append(
            await speech_generation(
                service,
                item.input,
                voice,
                item.instructions or body.instructions,
                item.language or body.language,
                param=f"inputs.{i}.voice",
            )
        )
    session = session_of(request)
    tickets = []
    try:
        for i, gen in enumerate(gens):
            gen.session_id = session
            gen.speech_sampling = speech_sampling(request, body, i)
            tickets.append(service.admit(session, RequestKind.SPEECH))
    except BaseException:
        for t in tickets:
            t.release()
        raise
    try:
        results = await until_disconnect(
            request,
            asyncio.gather(*(collect(service, g, t) for g, t in zip(gens, tickets, strict=True))),
        )
    finally:
        for t in tickets:
            t.release()
    if results is None:
        return closed_response()
    data = [
        {
            "object": "speech",
            "index": i,
            "format": fmt,
            "sample_rate": rate,
            "audio": base64.b64encode(whole_audio(bytes(r.pcm16), fmt, body.speed, rate)).decode(),
            "seconds": round(audio.pcm16_seconds(bytes(r.pcm16)) / body.speed, 3),
        }
        for i, r in enumerate(results)
    ]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")


async def _audio_stream(
    service: WorkerService,
    gen: GenerationRequest,
    ticket: Ticket,
    fmt: str,
    speed: float,
    rate: int,
):
    done = False
    out = speech_formats.Output(fmt, speed, rate)
    try:
        if fmt == "wav":
            yield audio.wav_header(None, rate)
        async with events(service, gen) as stream:
            async for event in stream:
                if isinstance(event, AudioChunk) and event.pcm16:
                    ticket.audio(len(event.pcm16))
                    service.metrics.audio_out.inc(audio.pcm16_seconds(event.pcm16))
                    data = out.feed(event.pcm16)
                    if data:
                        yield data
        tail = out.close()
        if tail:
            yield tail
        done = True
    finally:
        if not done:
            service.metrics.aborted.inc()
    # A StageFailed escapes here on purpose: the server then cuts the chunked body, so the
    # client sees a truncated transfer instead of a short file that looks complete.


async def _sse_stream(
    service: WorkerService,
    gen: GenerationRequest,
    ticket: Ticket,
    fmt: str,
    speed: float,
    rate: int,
):
    done = False
    finished = Finished("stop")
    words: list[tuple[str, float, float]] = []
    out = speech_formats.Output(fmt, speed, rate)  # (wav: raw pcm16, no header in events)
    try:
        async with events(service, gen) as stream:
            async for event in stream:
                if isinstance(event, AudioChunk) and event.pcm16:
                    ticket.audio(len(event.pcm16))
                    service.metrics.audio_out.inc(audio.pcm16_seconds(event.pcm16))
                    pcm = out.feed(event.pcm16)
                    if pcm:
                        data = base64.b64encode(pcm).decode()
                        yield b"data: " + orjson.dumps(
                            {"type": "speech.audio.delta", "audio": data}
                        )
                        yield b"\n\n"
                elif isinstance(event, WordTimings):
                    words += event.words
                elif isinstance(event, Finished):
                    finished = event
        tail = out.close()
        if tail:
            data = base64.b64encode(tail).decode()
            yield b"data: " + orjson.dumps({"type": "speech.audio.delta", "audio": data})
            yield b"\n\n"
        if gen.word_timestamps:
            stamps = {"type": "speech.audio.word_timestamps", "words": word_entries(words, speed)}
            yield b"data: " + orjson.dumps(stamps) + b"\n\n"
        usage: dict[str, Any] = {
            "input_tokens": finished.prompt_tokens,
            "output_tokens": finished.completion_tokens,
        }
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        if finished.text_tokens_read is not None:
            usage["input_token_details"] = {"text_tokens": finished.text_tokens_read}
        yield b"data: " + orjson.dumps({"type": "speech.audio.done", "usage": usage}) + b"\n\n"
        done = True
    except StageFailed as exc:
        payload = error_body(*stage_error(exc))
        yield b"data: " + orjson.dumps(payload) + b"\n\n"
        done = True
    finally:
        if not done:
            service.metrics.aborted.inc()
