"""vLLM-Omni's dialect of the streamed-text speech socket: ``/v1/audio/speech/stream`` whose
first event is ``session.config``. It is the protocol of vLLM-Omni's speech WebSocket, which
LiveKit's ``livekit-plugins-baseten`` ``Qwen3TTS`` speaks (the one production client for text
streamed into Qwen3-TTS); the stages and the streamed-text path are ``worker.api.speech_stream``'s.

Client -> worker (JSON text frames):

- ``session.config``: the session's settings, sticky until the next one (sent again between
  utterances): ``voice`` (a speaker, an OpenAI alias, or a voice uploaded to the fleet with
  ``POST /v1/audio/voices``), ``model``, ``task_type`` (the served checkpoint's: ``Base``,
  ``CustomVoice`` or ``VoiceDesign``), ``language`` (``Auto`` or a name), ``instructions``,
  ``response_format``, ``stream_audio``, ``speed``, ``max_new_tokens`` (codec frames per
  utterance), ``timestamp_type: "word"`` with ``timestamp_transport_strategy: "sync"`` (a spec
  with an aligner stage), the talker's ``temperature``, ``top_p``, ``top_k``,
  ``repetition_penalty``, ``seed``. A field this worker cannot honour is an ``error`` naming it.
- ``input.text {text}``: more text; the first after a flush begins an utterance, which the
  talker starts speaking at once (it reads the text as it comes: the dialect's sentence
  splitting would only wait for punctuation, so ``split_granularity`` other than ``none`` is
  refused).
- ``input.done``: a flush: the utterance's text is complete. An empty flush answers
  ``session.done`` with no sentence (LiveKit's keepalive).
- ``session.close``: the worker closes the socket.

Worker -> client, per utterance in order: ``audio.start {sentence_index, utterance_index,
format, sample_rate, channels}`` at its first audio, the audio as binary frames (raw pcm16 as
it is made with ``stream_audio``; else the whole file of ``response_format`` in one frame),
``audio.done {sentence_index, utterance_index, total_bytes, error, timestamp_info?}``, then
``session.done {total_sentences, utterance_index}``. A mistake is ``error {message, code,
param}`` and the socket stays open. The voice control events of Baseten's build (``voice.add``,
``voice.list``) are refused: voices are uploaded with ``POST /v1/audio/voices`` and then served
by every worker of the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import MutableMapping
from typing import Any, Literal

import orjson
from fastapi import WebSocket
from pydantic import Field, ValidationError, model_validator

from fleet.errors import ErrorCode, OmniError
from worker.api import speech_formats
from worker.api.common import read_event
from worker.api.errors import from_pydantic, stage_error
from worker.api.generation import events
from worker.api.schemas import SPEECH_INPUT_CHARS, SpeechSampling, Voice
from worker.api.speech import (
    admitted_speech,
    check_word_timestamps,
    speech_sampling,
    whole_audio,
)
from worker.api.streamed_text import StreamedText
from worker.contract.pipeline import (
    AUDIO_OUTPUT_RATE,
    AudioChunk,
    GenerationRequest,
    StageFailed,
    WordTimings,
)
from worker.service import Ticket, WorkerService

# the events that open this dialect (the first a client sends)
OPENING_EVENTS = frozenset({"session.config", "voice.add", "voice.list", "voice.remove"})
_VOICE_EVENTS = ("voice.add", "voice.list", "voice.remove")


def _bad(message: str, param: str | None = None) -> OmniError:
    return OmniError(400, ErrorCode.INVALID_REQUEST, message, param)


class SessionConfig(SpeechSampling):
    type: Literal["session.config"]
    model: str | None = None
    voice: Voice
    task_type: Literal["Base", "CustomVoice", "VoiceDesign"] | None = None
    language: str | None = Field(None, max_length=32)
    instructions: str | None = Field(None, max_length=SPEECH_INPUT_CHARS)
    response_format: Literal["pcm", "wav", "flac", "mp3", "aac", "opus"] = "wav"  # (vLLM's)
    stream_audio: bool = False
    speed: float = Field(1.0, ge=0.25, le=4.0)
    max_new_tokens: int | None = Field(None, ge=1)
    timestamp_type: Literal["word"] | None = None
    timestamp_transport_strategy: Literal["sync", "async"] | None = None
    split_granularity: Literal["none", "sentence", "clause"] | None = None
    # vLLM-Omni's, refused when set: what this worker does not do
    initial_codec_chunk_frames: int | None = None
    x_vector_only_mode: bool | None = None
    ref_audio: str | None = None
    ref_text: str | None = None

    @model_validator(mode="after")
    def _served(self) -> SessionConfig:
        refusals = {
            "initial_codec_chunk_frames": "the vocoder's chunks are the spec's (streaming)",
            "x_vector_only_mode": "a voice is spoken as it was uploaded",
            "ref_audio": "voices are cloned from uploads: POST /v1/audio/voices, then name it",
            "ref_text": "voices are cloned from uploads: POST /v1/audio/voices with its text",
        }
        for field, why in refusals.items():
            if getattr(self, field) is not None:
                raise _bad(f"{field} is not served here: {why}", field)
        if self.split_granularity not in (None, "none"):
            raise _bad(
                "the talker reads the text as it comes, not sentence by sentence: "
                "split_granularity is 'none'",
                "split_granularity",
            )
        if self.timestamp_transport_strategy == "async":
            raise _bad("word times come in audio.done: 'sync'", "timestamp_transport_strategy")
        if self.stream_audio and (self.response_format != "pcm" or self.speed != 1.0):
            raise _bad("stream_audio sends raw pcm at speed 1.0", "response_format")
        return self


def _task_type(service: WorkerService) -> str:
    """What vLLM-Omni calls the served checkpoint: it designs a voice from words, speaks its
    built-in speakers, or clones."""
    if service.pipeline.designed_voice() is not None:
        return "VoiceDesign"
    return "CustomVoice" if service.pipeline.speakers() else "Base"


class _Utterance:
    def __init__(self, index: int, text: str, gen: GenerationRequest, ticket: Ticket) -> None:
        self.index = index
        self.text = StreamedText(text, "text")
        self.gen, self.ticket = gen, ticket
        gen.text_stream = self.text.pieces()


class VllmSpeechSession:
    """One socket in this dialect: its config, the utterance taking text, and the utterances
    spoken one after another (a flush's text may follow while the one before is spoken)."""

    def __init__(self, websocket: WebSocket, service: WorkerService) -> None:
        self.websocket, self.service = websocket, service
        self.config: SessionConfig | None = None
        self.taking: _Utterance | None = None  # the utterance text goes into
        self.queue: asyncio.Queue[_Utterance | None] = asyncio.Queue()  # None: an empty flush
        self.unspoken = 0  # utterances and flushes queued or being spoken
        self.utterances = 0
        self.speaker = asyncio.create_task(self._speak_in_turn())

    async def send(self, event: dict) -> None:
        await self.websocket.send_text(orjson.dumps(event).decode())

    async def serve(self, first: MutableMapping[str, Any]) -> None:
        try:
            message = first
            while True:
                if message["type"] == "websocket.disconnect":
                    return
                try:
                    if await self._handle(message.get("text")):
                        return
                except ValidationError as exc:
                    await self._error(from_pydantic(exc))
                except OmniError as exc:
                    await self._error(exc)
                message = await self.websocket.receive()
        finally:
            self.speaker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.speaker
            for utterance in self._queued():  # (one being spoken: released by _speak)
                if utterance is not None:
                    utterance.ticket.release()

    def _queued(self) -> list[_Utterance | None]:
        out = []
        while not self.queue.empty():
            out.append(self.queue.get_nowait())
        return out

    async def _error(self, exc: OmniError) -> None:
        await self._send_error(exc.message, exc.code, exc.param)

    async def _send_error(self, message: str, code: ErrorCode, param: str | None) -> None:
        await self.send({"type": "error", "message": message, "code": code.value, "param": param})

    async def _handle(self, text: str | None) -> bool:
        """One client event; True when the session ends (``session.close``)."""
        event = read_event(text)
        kind = event.get("type")
        if kind == "session.config":
            if self.taking is not None or self.unspoken:
                raise _bad("an utterance is under way: configure between utterances", "type")
            self.config = self._checked(SessionConfig.model_validate(event))
        elif kind in ("input.text", "input.done") and self.config is None:
            raise _bad("send session.config first", "type")
        elif kind == "input.text":
            piece = event.get("text")
            if not isinstance(piece, str) or set(event) != {"type", "text"}:
                raise _bad("input.text is {type, text} with text a string", "text")
            if self.taking is None:
                self.taking = await self._begin(piece)
            else:
                self.taking.text.add(piece, "text")
        elif kind == "input.done":
            self.unspoken += 1
            if self.taking is None:
                self.queue.put_nowait(None)
            else:
                self.taking.text.end()
                self.taking = None
        elif kind == "session.close":
            await self.websocket.close(1000)
            return True
        elif kind in _VOICE_EVENTS:
            raise _bad(
                f"{kind} is not served on this socket: voices are uploaded with POST "
                "/v1/audio/voices (stored in Redis, spoken by every worker) and listed with GET",
                "type",
            )
        else:
            raise _bad(f"unknown event type {kind!r}", "type")
        return False

    def _checked(self, config: SessionConfig) -> SessionConfig:
        service = self.service
        service.check_model(config.model or service.spec.name)
        served = _task_type(service)
        if config.task_type not in (None, served):
            raise _bad(f"model {service.spec.name!r} is a {served} checkpoint", "task_type")
        check_word_timestamps(service, config.timestamp_type is not None, raw_stream=False)
        return config

    async def _begin(self, text: str) -> _Utterance:
        config = self.config
        assert config is not None
        gen, ticket = await admitted_speech(
            self.service, None, text, config.voice, config.instructions, config.language
        )
        try:
            gen.speech_sampling = speech_sampling(self.websocket, config, self.utterances)
            gen.max_tokens = config.max_new_tokens
            gen.word_timestamps = config.timestamp_type is not None
            utterance = _Utterance(self.utterances, text, gen, ticket)
        except BaseException:
            ticket.release()
            raise
        self.utterances += 1
        self.unspoken += 1
        self.queue.put_nowait(utterance)
        return utterance

    async def _speak_in_turn(self) -> None:
        while True:
            utterance = await self.queue.get()
            try:
                if utterance is None:
                    await self.send({"type": "session.done", "total_sentences": 0})
                else:
                    await self._speak(utterance)
            finally:
                self.unspoken -= 1 if utterance is None else 2  # (its text's flush, and it)

    async def _speak(self, utterance: _Utterance) -> None:
        config = self.config
        assert config is not None
        ids = {"sentence_index": 0, "utterance_index": utterance.index}
        fmt = config.response_format
        out = speech_formats.Output(fmt, config.speed, AUDIO_OUTPUT_RATE)
        whole = bytearray()
        sent = 0
        words: list[tuple[str, float, float]] = []
        error = False
        try:
            async with events(self.service, utterance.gen) as stream:
                async for event in stream:
                    if isinstance(event, AudioChunk):
                        if not sent and not whole:
                            await self.send(
                                {"type": "audio.start", **ids, "format": fmt,
                                 "sample_rate": AUDIO_OUTPUT_RATE, "channels": 1}
                            )  # fmt: skip
                        utterance.ticket.audio(len(event.pcm16))
                        if config.stream_audio:
                            data = out.feed(event.pcm16)
                            sent += len(data)
                            await self.websocket.send_bytes(data)
                        else:
                            whole += event.pcm16
                    elif isinstance(event, WordTimings):
                        words += event.words
            if not config.stream_audio and whole:
                data = whole_audio(bytes(whole), fmt, config.speed, AUDIO_OUTPUT_RATE)
                sent = len(data)
                await self.websocket.send_bytes(data)
        except StageFailed as exc:
            error = True
            _, code, message, param = stage_error(exc)
            await self._send_error(message, code, param)
        finally:
            utterance.ticket.release()
        done: dict[str, Any] = {"type": "audio.done", **ids, "total_bytes": sent, "error": error}
        if utterance.gen.word_timestamps and not error:
            speed = config.speed
            done["timestamp_info"] = {
                "word_alignment": {
                    "words": [w for w, _, _ in words],
                    "word_start_times_seconds": [round(s / speed, 3) for _, s, _ in words],
                    "word_end_times_seconds": [round(e / speed, 3) for _, _, e in words],
                }
            }
        await self.send(done)
        await self.send({"type": "session.done", "total_sentences": 1,
                         "utterance_index": utterance.index})  # fmt: skip
