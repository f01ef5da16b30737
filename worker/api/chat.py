"""POST /v1/chat/completions: text and input_audio in; text, or text + audio, out; SSE when
``stream`` is set, with audio chunks as ``delta.audio`` as soon as the vocoder produces them."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass

import numpy as np
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.requests import HTTPConnection

from fleet.errors import error_body
from fleet.records import Endpoint, Modality
from worker.api import audio
from worker.api.common import (
    closed_response,
    read_json,
    service_of,
    session_of,
)
from worker.api.errors import stage_error
from worker.api.generation import Collected, merged_events
from worker.api.images import decode_image
from worker.api.limits import check_max_tokens
from worker.api.media import media_bytes
from worker.api.replay import created, reply_id
from worker.api.schemas import (
    AudioPart,
    ChatRequest,
    ImagePart,
    Message,
    ResponseFormat,
    TextPart,
    VideoPart,
)
from worker.api.textgen import (
    bad,
    choices,
    collect_all,
    event_stream,
    refuse_unserved,
    sampling_of,
    sse,
    stops,
    usage,
)
from worker.api.tools import Calls, ToolUse, tool_use
from worker.api.tools import history as tool_history
from worker.api.video import decode_video
from worker.api.voices import resolve_voice
from worker.contract import grammar as grammars
from worker.contract.grammar import Grammar
from worker.contract.pipeline import (
    AUDIO_INPUT_RATE,
    AudioChunk,
    Finished,
    GenerationRequest,
    RequestKind,
    StageFailed,
    TextDelta,
    TokenLogprob,
)
from worker.contract.sampling import Sampling
from worker.service import REPLY_AUDIO_TTL_S, Ticket, WorkerService

router = APIRouter()


async def _messages(service: WorkerService, body: ChatRequest) -> list[dict]:
    """The messages for the engine, each part where it stands in its own turn (as the model's
    processor takes them: ``[audio, text]`` is another prompt than ``[text, audio]``, and an
    earlier turn's clip belongs to that turn), media decoded: ``audio`` float32 at 16 kHz,
    ``image`` HxWx3, ``video`` frames. A message of text parts only is their text."""
    messages: list[dict] = []
    total_seconds = 0.0
    for i, message in enumerate(body.messages):
        if message.name is not None:  # (refused, not dropped: the prompt would not show it)
            raise bad(
                "the model's chat template has no speaker names: put the name in the content",
                f"messages.{i}.name",
            )
        if message.role == "developer":  # OpenAI's newer name for system instructions
            message = message.model_copy(update={"role": "system"})
        if message.audio is not None or message.refusal is not None:
            messages.append(await _earlier_reply(service, message, i))
            continue
        if message.role == "tool" or message.tool_calls:
            messages.append(_tool_turn(message, i))
            continue
        if isinstance(message.content, str) or message.content is None:
            messages.append({"role": message.role, "content": message.content or ""})
            continue
        parts: list[dict] = []
        for j, part in enumerate(message.content):
            param = f"messages.{i}.content.{j}"
            if isinstance(part, TextPart):
                if parts and parts[-1]["type"] == "text":  # adjacent texts: one run of text
                    parts[-1] = {"type": "text", "text": parts[-1]["text"] + part.text}
                else:
                    parts.append({"type": "text", "text": part.text})
            elif isinstance(part, ImagePart):
                if Modality.IMAGE not in service.capabilities.input_modalities:
                    raise bad(f"model {body.model!r} takes no image input", param)
                raw = await media_bytes(part.image_url.url, "image", service.settings, param)
                low = part.image_url.detail == "low"
                image = await asyncio.to_thread(decode_image, raw, param, low)
                parts.append({"type": "image", "image": image})
            elif isinstance(part, VideoPart):
                if Modality.VIDEO not in service.capabilities.input_modalities:
                    raise bad(f"model {body.model!r} takes no video input", param)
                raw = await media_bytes(part.video_url.url, "video", service.settings, param)
                video = await asyncio.to_thread(decode_video, raw, param)
                parts.append({"type": "video", "video": video.frames, "fps": video.fps})
            elif isinstance(part, AudioPart):
                if Modality.AUDIO not in service.capabilities.input_modalities:
                    raise bad(f"model {body.model!r} takes no audio input", param)
                param += ".input_audio"
                raw = audio.b64decode(part.input_audio.data, param + ".data")
                left = service.settings.max_audio_seconds - total_seconds
                clip = await audio.decode_audio_async(
                    raw, max_seconds=max(left, 0.0), param=param, container=part.input_audio.format
                )
                total_seconds += clip.size / AUDIO_INPUT_RATE
                parts.append({"type": "audio", "audio": clip.astype(np.float32)})
        if all(p["type"] == "text" for p in parts):
            messages.append({"role": message.role, "content": "".join(p["text"] for p in parts)})
        else:
            messages.append({"role": message.role, "content": parts})
    return messages


async def _earlier_reply(service: WorkerService, message: Message, i: int) -> dict:
    """An assistant turn given as its earlier spoken reply (``audio.id``, as a chat reply with
    audio named it) or as its refusal: its text is that reply's transcript, or the refusal."""
    field = "audio" if message.audio is not None else "refusal"
    param = f"messages.{i}.{field}"
    if message.role != "assistant":
        raise bad(f"only an assistant message has {field}", param)
    if message.audio is not None and message.refusal is not None:
        raise bad("an assistant message is its earlier audio or its refusal, not both", param)
    if message.tool_calls:
        raise bad(f"an assistant message with {field} has no tool_calls", param)
    content = message.content
    if not isinstance(content, str) and content is not None:
        raise bad(f"an assistant message with {field} has text only", f"messages.{i}.content")
    if message.refusal is not None:
        if content:
            raise bad("an assistant message is its content or its refusal, not both", param)
        return {"role": "assistant", "content": message.refusal}
    assert message.audio is not None
    transcript = await service.reply_transcript(message.audio.id)
    if transcript is None:
        raise bad(
            f"no spoken reply has the id {message.audio.id!r} (unknown, or past its expires_at, "
            f"{REPLY_AUDIO_TTL_S} s after it was made)",
            param + ".id",
        )
    if content and content != transcript:  # (the reply echoed whole: its content is the transcript)
        raise bad("the content differs from the transcript of the audio it names", param)
    return {"role": "assistant", "content": transcript}


def _tool_turn(message: Message, i: int) -> dict:
    """A ``tool`` result, or an assistant turn with ``tool_calls``, for the chat template."""
    if message.role == "tool" and not message.tool_call_id:
        raise bad("a tool message needs its tool_call_id", f"messages.{i}.tool_call_id")
    if message.tool_calls and message.role != "assistant":
        raise bad("only an assistant message has tool_calls", f"messages.{i}.tool_calls")
    if not isinstance(message.content, str) and message.content is not None:
        texts = [p.text for p in message.content if isinstance(p, TextPart)]
        if len(texts) != len(message.content):
            raise bad("a tool turn holds text only", f"messages.{i}.content")
        message = message.model_copy(update={"content": "".join(texts)})
    return tool_history(message)


def _grammar(fmt: ResponseFormat | None) -> Grammar | None:
    """``response_format`` -> the grammar the thinker holds the reply to (None: free text)."""
    if fmt is None or fmt.type == "text":
        return None
    if not grammars.available():
        raise bad(
            "response_format needs xgrammar on this worker (pip install 'omni-fleet[worker]')",
            "response_format",
        )
    if fmt.type == "json_object":
        return Grammar("json")
    if fmt.json_schema is None:
        raise bad("response_format json_schema needs its json_schema", "response_format")
    schema = fmt.json_schema.json_schema
    try:
        grammars.check_schema(schema)
    except ValueError as exc:
        param = "response_format.json_schema.schema"
        raise bad(f"{param} cannot be held to: {exc}", param) from None
    return Grammar("json_schema", orjson.dumps(schema).decode())


def logprobs_json(entries: list[TokenLogprob]) -> list[dict]:
    """OpenAI's ``logprobs.content``: each token, its bytes, log probability and rivals."""
    return [
        {
            "token": e.token,
            "logprob": e.logprob,
            "bytes": list(e.token.encode()),
            "top_logprobs": [
                {"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in e.top
            ],
        }
        for e in entries
    ]


@dataclass(slots=True)
class ChatTurn:
    """A chat request checked and admitted: one generation per choice, its tools, its ticket
    (held by the caller from here on)."""

    gens: list[GenerationRequest]
    tools: ToolUse | None
    ticket: Ticket


async def admitted_chat(
    request: HTTPConnection, service: WorkerService, body: ChatRequest
) -> ChatTurn:
    """Every check of a chat request, then its admission and its engine request: what
    ``/v1/chat/completions`` and ``/v1/responses`` (chat in another dress) share. A 400 names the
    chat field (the Responses API renames it to its own)."""
    model = body.model
    want_audio = "audio" in (body.modalities or ["text"])
    if want_audio:
        if Modality.AUDIO not in service.capabilities.output_modalities:
            raise bad(f"model {model!r} does not produce audio", "modalities")
        if body.audio is None:
            raise bad(
                "modalities includes 'audio': the 'audio' {voice, format} is required", "audio"
            )
    refuse_unserved(body)
    for field in ("max_completion_tokens", "max_tokens"):
        check_max_tokens(service.spec, getattr(body, field), field)
    n = body.n or 1
    if n > 1 and want_audio:
        raise bad("n > 1 is not supported with audio output", "n")
    if body.top_logprobs is not None and not body.logprobs:
        raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    grammar = _grammar(body.response_format)
    tools = tool_use(body, grammars.available())
    if tools is not None:
        if want_audio:
            raise bad("tools are not supported with audio output", "tools")
        if body.logprobs:
            raise bad("logprobs are not served with tools", "logprobs")
        grammar = tools.grammar() or grammar
    stop = stops(body.stop)
    if stop and want_audio:
        # the talker speaks each token as it comes: it cannot unsay what follows a stop text
        raise bad("stop is not supported with audio output; drop one of them", "stop")
    ticket = service.admit(
        session_of(request, body.user), RequestKind.CHAT, output_audio=want_audio, requests=n
    )
    try:
        messages = await _messages(service, body)
        voice, voice_audio = (None, None)
        if want_audio:
            assert body.audio is not None
            voice, voice_audio = await resolve_voice(service, body.audio.voice, "audio.voice")
        sampling = sampling_of(request, body)
        gen = GenerationRequest(
            request_id=reply_id(request, "chatcmpl"),
            sampling=sampling,
            # the talker samples as its checkpoint says, seeded as the thinker; temperature 0
            # makes it greedy too
            speech_sampling=Sampling(
                temperature=0.0 if body.temperature == 0 else None, seed=sampling.seed
            )
            if want_audio
            else None,
            stop=stop + (tools.stops() if tools is not None else ()),
            logprobs=(body.top_logprobs or 0) if body.logprobs else None,
            grammar=grammar,
            tools=tools.tools if tools is not None else None,
            kind=RequestKind.CHAT,
            messages=messages,
            output_audio=want_audio,
            voice=voice,
            voice_audio=voice_audio,
            max_tokens=body.max_completion_tokens or body.max_tokens,
            session_id=session_of(request, body.user),
        )
    except BaseException:
        ticket.release()
        raise
    return ChatTurn(choices(gen, n), tools, ticket)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    service = service_of(request)
    body = await read_json(request, ChatRequest)
    model = service.check_serves(body.model, Endpoint.CHAT)
    turn = await admitted_chat(request, service, body)
    gens, ticket, n = turn.gens, turn.ticket, len(turn.gens)
    gen = gens[0]
    want_audio = gen.output_audio
    at = created(request)
    audio_id = reply_id(request, "audio")
    calls = calls_of(request, turn.tools, n)
    if body.stream:
        return event_stream(_stream(service, body, gens, ticket, at, audio_id, calls), ticket)
    results = await collect_all(request, service, gens, ticket)
    if results is None:
        return closed_response()
    answers = [_choice(i, r, body, calls[i]) for i, r in enumerate(results)]
    result = results[0]
    if want_audio:
        text = answers[0]["message"]["content"]
        message = answers[0]["message"]
        assert body.audio is not None
        fmt = "wav" if body.audio.format == "wav" else "pcm"
        await service.remember_reply(audio_id, text or "")
        message["audio"] = {
            "id": audio_id,
            "data": base64.b64encode(audio.encode(bytes(result.pcm16), fmt)).decode(),
            "expires_at": at + REPLY_AUDIO_TTL_S,
            "transcript": text,
        }
    return Response(
        orjson.dumps(
            {
                "id": gen.request_id,
                "object": "chat.completion",
                "created": at,
                "model": model,
                "choices": answers,
                "usage": _usage_of([r.finished or Finished("stop") for r in results]),
            }
        ),
        media_type="application/json",
    )


def _tool_deltas(text: str, found: list[dict], calls: Calls) -> list[dict]:
    """The deltas of a choice's text and completed tool calls (each call whole, with its index
    among the choice's calls)."""
    out: list[dict] = [{"content": text}] if text else []
    first = len(calls.calls) - len(found)
    out += [{"tool_calls": [{"index": first + k, **call}]} for k, call in enumerate(found)]
    return out


def _usage_of(finished: list[Finished]) -> dict:
    return usage(finished[:1], finished)  # (one prompt: its n choices)


def calls_of(request: HTTPConnection, tools: ToolUse | None, n: int) -> list[Calls | None]:
    """Per choice, what takes its tool calls out of its text (None: no tools). Call ids are
    the same on every send of one router request (worker.api.replay)."""
    if tools is None:
        return [None] * n
    base = reply_id(request, "call")
    return [Calls(tools, lambda k, i=i: f"{base}-{i}-{k}") for i in range(n)]


def _choice(index: int, result: Collected, body: ChatRequest, calls: Calls | None) -> dict:
    text, reason = "".join(result.text), result.finish_reason
    message: dict = {"role": "assistant", "content": text, "refusal": None}
    if calls is not None:
        sent, found = calls.feed(text)
        rest, more = calls.finish()
        if found or more:
            message["content"] = (sent + rest) or None
            message["tool_calls"] = found + more
        reason = calls.finish_reason(reason)
    logprobs = (
        {"content": logprobs_json(result.logprobs), "refusal": None} if body.logprobs else None
    )
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": reason}


async def _stream(
    service: WorkerService,
    body: ChatRequest,
    gens: list[GenerationRequest],
    ticket: Ticket,
    created: int,
    audio_id: str,
    calls: list[Calls | None],
):
    gen = gens[0]
    expires = created + REPLY_AUDIO_TTL_S
    done = False

    def chunk(
        index: int, delta: dict, finish_reason: str | None = None, logprobs: list | None = None
    ) -> bytes:
        choice: dict = {"index": index, "delta": delta, "finish_reason": finish_reason}
        if logprobs is not None:
            choice["logprobs"] = {"content": logprobs_json(logprobs), "refusal": None}
        return sse(
            {
                "id": gen.request_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": body.model,
                "choices": [choice],
            }
        )

    finished = [Finished("stop") for _ in gens]
    transcript: list[str] = []
    try:
        for i in range(len(gens)):
            yield chunk(i, {"role": "assistant", "content": ""})
        async with merged_events(service, gens) as stream:
            async for i, event in stream:
                if isinstance(event, TextDelta):
                    ticket.text()
                    transcript.append(event.text)
                    c = calls[i]
                    if c is None:
                        yield chunk(i, {"content": event.text}, None, event.logprobs)
                        continue
                    sent, found = c.feed(event.text)
                    for out in _tool_deltas(sent, found, c):
                        yield chunk(i, out)
                elif isinstance(event, AudioChunk):
                    ticket.audio(len(event.pcm16))
                    service.metrics.audio_out.inc(audio.pcm16_seconds(event.pcm16))
                    data = base64.b64encode(event.pcm16).decode()
                    yield chunk(i, {"audio": {"id": audio_id, "data": data, "expires_at": expires}})
                elif isinstance(event, Finished):
                    finished[i] = event
        service.metrics.tokens_out.inc(sum(f.completion_tokens for f in finished))
        if gen.output_audio:
            await service.remember_reply(audio_id, "".join(transcript))
            yield chunk(0, {"audio": {"id": audio_id, "transcript": "".join(transcript)}})
        for i, f in enumerate(finished):
            c = calls[i]
            if c is not None:
                for out in _tool_deltas(*c.finish(), c):
                    yield chunk(i, out)
            yield chunk(i, {}, f.finish_reason if c is None else c.finish_reason(f.finish_reason))
        if body.stream_options is not None and body.stream_options.include_usage:
            yield sse(
                {
                    "id": gen.request_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": body.model,
                    "choices": [],
                    "usage": _usage_of(finished),
                }
            )
        done = True
    except StageFailed as exc:
        # The status line is long gone: the SDKs raise on an SSE "error" payload.
        yield sse(error_body(*stage_error(exc)))
        done = True
    finally:
        if not done:
            service.metrics.aborted.inc()
    yield sse("[DONE]")
