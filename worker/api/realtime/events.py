"""Client events of the OpenAI Realtime API, as pydantic models: the GA shapes
(``session.audio.input.format`` ...) and the beta ones (``input_audio_format`` ...) both parse.
``parse`` turns one WebSocket message into one of them or a ``RealtimeError``."""

from __future__ import annotations

from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.api.errors import validation_error
from worker.api.realtime.errors import Code, RealtimeError

MAX_ID_CHARS = 64


class _Model(BaseModel):
    # Fields OpenAI defines that this server does not use (tools, tracing, noise reduction...)
    # are accepted and ignored, as a client written for OpenAI sends them.
    model_config = ConfigDict(extra="ignore")


class ClientEvent(_Model):
    type: str
    event_id: str | None = None


# -- session.update ----------------------------------------------------------------------------


class AudioFormatIn(_Model):
    type: str = "audio/pcm"
    rate: int | None = None


class TurnDetectionIn(_Model):
    type: Literal["server_vad", "semantic_vad"]
    threshold: float | None = Field(None, ge=0.0, le=1.0)
    prefix_padding_ms: int | None = Field(None, ge=0, le=10_000)
    silence_duration_ms: int | None = Field(None, ge=0, le=10_000)
    create_response: bool | None = None
    interrupt_response: bool | None = None
    eagerness: Literal["low", "medium", "high", "auto"] | None = None


class VoiceId(_Model):
    id: str


class TranscriptionIn(_Model):
    model: str | None = None  # any name: the served model transcribes
    language: str | None = None
    prompt: str | None = None


class AudioInputIn(_Model):
    format: AudioFormatIn | None = None
    turn_detection: TurnDetectionIn | None = None
    transcription: TranscriptionIn | None = None


class AudioOutputIn(_Model):
    format: AudioFormatIn | None = None
    voice: str | VoiceId | None = None


class AudioIn(_Model):
    input: AudioInputIn | None = None
    output: AudioOutputIn | None = None


Modality = Literal["text", "audio"]
BetaAudioFormat = Literal["pcm16", "g711_ulaw", "g711_alaw"]


class SessionIn(_Model):
    type: Literal["realtime", "transcription"] | None = None
    instructions: str | None = None
    output_modalities: list[Modality] | None = Field(None, min_length=1)
    audio: AudioIn | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    # sampling of the replies (0 or unset: greedy, as chat); the beta API's session field
    temperature: float | None = Field(None, ge=0, le=2)
    # beta spellings
    modalities: list[Modality] | None = Field(None, min_length=1)
    voice: str | None = None
    input_audio_format: BetaAudioFormat | None = None
    output_audio_format: BetaAudioFormat | None = None
    turn_detection: TurnDetectionIn | None = None
    input_audio_transcription: TranscriptionIn | None = None
    max_response_output_tokens: int | Literal["inf"] | None = None


class SessionUpdate(ClientEvent):
    session: SessionIn


# -- input audio -------------------------------------------------------------------------------


class AudioAppend(ClientEvent):
    audio: str


class TextAppend(ClientEvent):
    """This server's extension for text-to-speech models: text spoken as it is written."""

    delta: str = Field(min_length=1)


# -- conversation items ------------------------------------------------------------------------


class ContentIn(_Model):
    type: Literal["input_text", "input_audio", "text", "audio", "output_text", "output_audio"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None


class ItemIn(_Model):
    id: str | None = Field(None, min_length=1, max_length=MAX_ID_CHARS)
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system"]
    content: list[ContentIn] = Field(min_length=1)


class ItemCreate(ClientEvent):
    item: ItemIn
    previous_item_id: str | None = None


class ItemRef(ClientEvent):
    item_id: str


class ItemTruncate(ItemRef):
    content_index: int = Field(0, ge=0)
    audio_end_ms: int = Field(ge=0)


# -- responses ---------------------------------------------------------------------------------


class ResponseIn(_Model):
    instructions: str | None = None
    output_modalities: list[Modality] | None = Field(None, min_length=1)
    modalities: list[Modality] | None = Field(None, min_length=1)
    audio: AudioIn | None = None
    voice: str | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    max_response_output_tokens: int | Literal["inf"] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    conversation: str | None = None  # "auto" (default) or "none": out of band
    input: list[ItemIn] | None = None
    metadata: dict | None = None


class ResponseCreate(ClientEvent):
    response: ResponseIn | None = None


class ResponseCancel(ClientEvent):
    response_id: str | None = None


EVENTS: dict[str, type[ClientEvent]] = {
    "session.update": SessionUpdate,
    "input_audio_buffer.append": AudioAppend,
    "input_audio_buffer.commit": ClientEvent,
    "input_audio_buffer.clear": ClientEvent,
    "input_text_buffer.append": TextAppend,
    "input_text_buffer.commit": ClientEvent,
    "conversation.item.create": ItemCreate,
    "conversation.item.truncate": ItemTruncate,
    "conversation.item.delete": ItemRef,
    "conversation.item.retrieve": ItemRef,
    "response.create": ResponseCreate,
    "response.cancel": ResponseCancel,
}


def parse(raw: str | bytes) -> ClientEvent:
    """One client message -> its event model. Raises ``RealtimeError``: ``invalid_json``,
    ``unknown_event``, or ``invalid_request`` naming the offending field."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RealtimeError(Code.INVALID_JSON, f"message is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RealtimeError(Code.INVALID_REQUEST, "an event must be a JSON object")
    kind = data.get("type")
    if not isinstance(kind, str):
        raise RealtimeError(Code.INVALID_REQUEST, "an event needs a string 'type'", "type")
    model = EVENTS.get(kind)
    if model is None:
        raise RealtimeError(
            Code.UNKNOWN_EVENT,
            f"unknown event type {kind[:80]!r}; this server takes: {', '.join(EVENTS)}",
            "type",
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        bad = validation_error(exc.errors(include_url=False))
        raise RealtimeError(Code.INVALID_REQUEST, f"{kind}: {bad.message}", bad.param) from exc


def event_id_of(raw: str | bytes) -> str | None:
    """The client's ``event_id`` of a message that failed to parse, when it has one."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    value = data.get("event_id") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None
