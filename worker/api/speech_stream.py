"""``/v1/audio/speech/stream``: text streamed into speech, over a WebSocket.

An agent that writes its reply token by token starts speaking it after its first words, not
after its last: the talker reads the text in the model's streaming-text mode (one text token per
audio frame), waits where the text has not arrived yet, and ends the utterance after the last
word. Served by the models that have that mode (Qwen3-TTS, built-in voices and voices cloned
without a transcript).

Client -> worker (JSON text frames):

- ``{"type": "speech.create", "voice", "model"?, "input"?, "language"?, "instructions"?,
  "response_format"? (pcm, mulaw, alaw), "sample_rate"?, "temperature"?, "top_p"?, "top_k"?,
  "repetition_penalty"?, "seed"?, "word_timestamps"?}``: an utterance begins (``input``: its
  first text, if any; ``word_timestamps``, with a spec that has an aligner stage: the words
  spoken, with their times, in ``speech.audio.done``);
- ``{"type": "input_text.delta", "delta": "..."}``: more of its text;
- ``{"type": "input_text.done"}``: its text is complete.

Worker -> client: ``speech.created {id, response_format, sample_rate}``, then
``speech.audio.delta {id, audio}`` (base64 of the next bytes: pcm16 mono at the sample rate, 24
kHz unless asked, or G.711 at 8 kHz) as the vocoder makes it, then ``speech.audio.done {id,
usage, words?}`` (``words``: ``[{word, start, end}]`` in seconds, when asked); after that the
next ``speech.create`` may come. A mistake is an ``error`` event (``{"error": {code, message,
param}}``) and the socket stays open; a wrong worker token or a model without streamed text
closes it (1008). The router routes the socket like ``/v1/realtime``. A socket whose first event
is ``session.config`` speaks vLLM-Omni's dialect instead (``worker.api.speech_stream_vllm``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Literal

import orjson
from fastapi import APIRouter, WebSocket
from pydantic import Field, TypeAdapter, ValidationError
from starlette.websockets import WebSocketDisconnect

from fleet.errors import ErrorCode, OmniError, error_body
from fleet.records import Endpoint
from worker.api import speech_formats
from worker.api.common import read_event
from worker.api.errors import from_pydantic, stage_error
from worker.api.generation import events
from worker.api.realtime.endpoint import authorised
from worker.api.schemas import SPEECH_INPUT_CHARS, Body, SampleRate, SpeechSampling, Voice
from worker.api.speech import (
    admitted_speech,
    check_word_timestamps,
    speech_sampling,
    word_entries,
)
from worker.api.speech_stream_vllm import OPENING_EVENTS, VllmSpeechSession
from worker.api.streamed_text import StreamedText
from worker.contract.pipeline import (
    AudioChunk,
    Finished,
    GenerationRequest,
    StageFailed,
    WordTimings,
)
from worker.service import Ticket, WorkerService

router = APIRouter()

POLICY_VIOLATION = 1008


class SpeechCreate(SpeechSampling):
    type: Literal["speech.create"]
    model: str | None = None
    voice: Voice
    response_format: Literal["pcm", "mulaw", "alaw"] = "pcm"
    sample_rate: SampleRate | None = None
    input: str = Field("", max_length=SPEECH_INPUT_CHARS)
    language: str | None = Field(None, max_length=32)
    instructions: str | None = Field(None, max_length=SPEECH_INPUT_CHARS)
    word_timestamps: bool = False


class TextDelta(Body):
    type: Literal["input_text.delta"]
    delta: str = Field(max_length=SPEECH_INPUT_CHARS)


class TextDone(Body):
    type: Literal["input_text.done"]


ClientEvent: TypeAdapter[SpeechCreate | TextDelta | TextDone] = TypeAdapter(
    SpeechCreate | TextDelta | TextDone
)


class _Utterance:
    """One utterance under way: its text as it comes, and the task that speaks it."""

    def __init__(self, gen_id: str, text: str) -> None:
        self.id = gen_id
        self.text = StreamedText(text, "input")
        self.task: asyncio.Task | None = None

    @property
    def speaking(self) -> bool:
        return self.task is not None and not self.task.done()


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(websocket: WebSocket) -> None:
    service: WorkerService = websocket.app.state.service
    token = service.settings.token
    if token is not None and not authorised(websocket, token.get_secret_value()):
        await websocket.close(POLICY_VIOLATION, "missing or wrong worker token")
        return
    family = service.family
    if Endpoint.SPEECH not in service.capabilities.endpoints or not family.streams_text:
        await websocket.close(
            POLICY_VIOLATION, f"model {service.spec.name!r} does not take streamed text"
        )
        return
    await websocket.accept()
    current: _Utterance | None = None

    async def send(event: dict) -> None:
        await websocket.send_text(orjson.dumps(event).decode())

    try:
        message = await websocket.receive()
        if _opening(message) in OPENING_EVENTS:  # vLLM-Omni's dialect
            await VllmSpeechSession(websocket, service).serve(message)
            return
        while True:
            if message["type"] == "websocket.disconnect":
                break
            try:
                if message.get("text") is None:
                    raise OmniError(400, ErrorCode.INVALID_REQUEST, "events are JSON text frames")
                event = ClientEvent.validate_json(message["text"])
                if isinstance(event, SpeechCreate):
                    if current is not None and current.speaking:
                        raise OmniError(
                            400, ErrorCode.INVALID_REQUEST,
                            f"utterance {current.id} is still being spoken", "type",
                        )  # fmt: skip
                    current = await _start(websocket, service, event, send)
                elif current is None or current.text.done or not current.speaking:
                    raise OmniError(
                        400, ErrorCode.INVALID_REQUEST,
                        "no utterance takes text now (none began, or it ended): send speech.create",
                        "type",
                    )  # fmt: skip
                elif isinstance(event, TextDelta):
                    current.text.add(event.delta, "delta")
                else:
                    current.text.end()
            except ValidationError as exc:
                await send(from_pydantic(exc).body())
            except OmniError as exc:
                await send(exc.body())
            message = await websocket.receive()
    except WebSocketDisconnect:
        pass
    finally:
        if current is not None and current.task is not None:
            current.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await current.task


def _opening(message: MutableMapping[str, Any]) -> str:
    """The type of a socket's first event ("": not a JSON object with one)."""
    try:
        kind = read_event(message.get("text")).get("type")
    except OmniError:
        return ""
    return kind if isinstance(kind, str) else ""


Send = Callable[[dict], Awaitable[None]]


async def _start(
    websocket: WebSocket, service: WorkerService, event: SpeechCreate, send: Send
) -> _Utterance:
    service.check_model(event.model or service.spec.name)
    rate = speech_formats.output_rate(event.response_format, event.sample_rate)
    check_word_timestamps(service, event.word_timestamps, raw_stream=False)
    gen, ticket = await admitted_speech(
        service, None, event.input, event.voice, event.instructions, event.language
    )
    gen.speech_sampling = speech_sampling(websocket, event)
    gen.word_timestamps = event.word_timestamps
    utterance = _Utterance(gen.request_id, event.input)
    gen.text_stream = utterance.text.pieces()
    await send(
        {"type": "speech.created", "id": utterance.id,
         "response_format": event.response_format, "sample_rate": rate}
    )  # fmt: skip
    out = speech_formats.Output(event.response_format, 1.0, rate)
    utterance.task = asyncio.create_task(_speak(service, gen, ticket, utterance, out, send))
    return utterance


async def _speak(
    service: WorkerService,
    gen: GenerationRequest,
    ticket: Ticket,
    utterance: _Utterance,
    out: speech_formats.Output,
    send: Send,
) -> None:
    async def delta(data: bytes) -> None:
        if data:
            audio = base64.b64encode(data).decode()
            await send({"type": "speech.audio.delta", "id": utterance.id, "audio": audio})

    try:
        finished = None
        words: list[tuple[str, float, float]] = []
        async with events(service, gen) as stream:
            async for event in stream:
                if isinstance(event, AudioChunk):
                    ticket.audio(len(event.pcm16))
                    await delta(out.feed(event.pcm16))
                elif isinstance(event, WordTimings):
                    words += event.words
                elif isinstance(event, Finished):
                    finished = event
        await delta(out.close())
        usage: dict[str, Any] = {
            "input_tokens": finished.prompt_tokens if finished else 0,
            "output_frames": finished.completion_tokens if finished else 0,
        }
        if finished and finished.text_tokens_read is not None:
            usage["input_token_details"] = {"text_tokens": finished.text_tokens_read}
        done: dict[str, Any] = {"type": "speech.audio.done", "id": utterance.id, "usage": usage}
        if gen.word_timestamps:
            done["words"] = word_entries(words, 1.0)
        await send(done)
    except StageFailed as exc:
        with contextlib.suppress(Exception):
            await send(error_body(*stage_error(exc)))
    except (WebSocketDisconnect, RuntimeError):
        pass  # the client left
    finally:
        ticket.release()
