"""Client events of the OpenAI Realtime API, as pydantic models: the GA shapes
(``session.audio.input.format`` ...) and the beta ones (``input_audio_format`` ...) both parse.
``parse`` turns one WebSocket message into one of them or a ``RealtimeError``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from worker.api import languages
from worker.api.errors import validation_error
from worker.api.realtime.errors import Code, RealtimeError

MAX_ID_CHARS = 64


class _Model(BaseModel):
    # A field this server does not know is refused (an error event naming it), not dropped.
    model_config = ConfigDict(extra="forbid")


def _unserved(*neutral: Any) -> AfterValidator:
    """A field OpenAI defines that this server does not serve: a client written for OpenAI may
    send it at a neutral value (empty, null, the default), which asks nothing of the server;
    any other value is refused, naming the field, rather than dropped."""

    def check(value: Any) -> Any:
        if value not in neutral:
            raise ValueError(f"{value!r} is not served by this server")
        return value

    return AfterValidator(check)


# tracing, included extras and stored prompts: not served on realtime; their neutral values,
# as OpenAI's SDKs send them by default
Unset = Annotated[Any, _unserved(None)]


class ClientEvent(_Model):
    type: str
    event_id: str | None = None


# -- function calling (the GA shape: a tool's fields at its top level) ---------------------


class FunctionTool(_Model):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = Field(None, max_length=8192)
    parameters: dict[str, Any] | None = None  # a JSON schema (an object's)


class NamedFunction(_Model):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)


Tools = Annotated[list[FunctionTool] | None, Field(max_length=128)]
ToolChoice = Literal["auto", "none", "required"] | NamedFunction | None


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
    idle_timeout_ms: Unset = None


class VoiceId(_Model):
    id: str


def _known_language(code: str) -> str:
    if languages.name_of(code) is None:
        raise ValueError(f"unknown ISO-639-1 code; known: {', '.join(sorted(languages.NAMES))}")
    return code


class TranscriptionIn(_Model):
    model: str | None = None  # any name: the served model transcribes
    language: str | None = Field(None, max_length=32)
    prompt: str | None = None
    # as on /v1/audio/transcriptions: keywords join the context after the prompt; one of
    # ``languages`` (ISO-639-1) is the hint (worker.api.realtime.transcripts)
    keywords: list[Annotated[str, Field(max_length=64)]] | None = Field(None, max_length=64)
    languages: list[Annotated[str, AfterValidator(_known_language)]] | None = Field(
        None, max_length=1
    )
    delay: Annotated[str | None, _unserved(None)] = None  # (OpenAI's latency knob)


class AudioInputIn(_Model):
    format: AudioFormatIn | None = None
    turn_detection: TurnDetectionIn | None = None
    transcription: TranscriptionIn | None = None
    noise_reduction: Unset = None


class AudioOutputIn(_Model):
    format: AudioFormatIn | None = None
    voice: str | VoiceId | None = None
    speed: Annotated[float | None, _unserved(None, 1.0)] = None


class AudioIn(_Model):
    input: AudioInputIn | None = None
    output: AudioOutputIn | None = None


Modality = Literal["text", "audio"]
BetaAudioFormat = Literal["pcm16", "g711_ulaw", "g711_alaw"]


class SessionIn(_Model):
    type: Literal["realtime", "transcription"] | None = None
    model: str | None = None  # (checked against the served model's names)
    instructions: str | None = None
    output_modalities: list[Modality] | None = Field(None, min_length=1)
    audio: AudioIn | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    # sampling of the replies (0 or unset: greedy, as chat); the beta API's session field
    temperature: float | None = Field(None, ge=0, le=2)
    # this server's extensions, as on chat: nucleus sampling and a seed for the replies
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, lt=2**63)
    tools: Tools = None
    tool_choice: ToolChoice = None
    tracing: Unset = None
    include: Annotated[list | None, _unserved(None, [])] = None
    prompt: Unset = None
    truncation: Annotated[Any, _unserved(None, "auto")] = None  # (auto: as this server does)
    # beta spellings
    modalities: list[Modality] | None = Field(None, min_length=1)
    voice: str | None = None
    input_audio_format: BetaAudioFormat | None = None
    output_audio_format: BetaAudioFormat | None = None
    turn_detection: TurnDetectionIn | None = None
    input_audio_transcription: TranscriptionIn | None = None
    max_response_output_tokens: int | Literal["inf"] | None = None
    input_audio_noise_reduction: Unset = None
    speed: Annotated[float | None, _unserved(None, 1.0)] = None


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
    """A message (role, content), a function call the model made (call_id, name, arguments:
    a client may add earlier ones) or a call's result (call_id, output); which fields each
    kind needs is checked in ``conversation.item_from_client``."""

    id: str | None = Field(None, min_length=1, max_length=MAX_ID_CHARS)
    type: Literal["message", "function_call", "function_call_output"] = "message"
    role: Literal["user", "assistant", "system"] | None = None
    content: list[ContentIn] | None = Field(None, min_length=1)
    call_id: str | None = Field(None, min_length=1, max_length=128)
    name: str | None = Field(None, min_length=1, max_length=64)
    arguments: str | None = None  # JSON text
    output: str | None = None


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
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0, lt=2**63)
    conversation: Literal["auto", "none"] | None = None  # none: out of band
    input: list[ItemIn] | None = None
    metadata: dict | None = None  # (echoed on the response, as OpenAI's)
    tools: Tools = None
    tool_choice: ToolChoice = None
    prompt: Unset = None


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
