"""A realtime session's settings: what ``session.update`` changes, and how ``session.created`` /
``session.updated`` show them (GA shape, or the beta one for ``OpenAI-Beta: realtime=v1``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field

from worker.api.realtime.errors import Code, RealtimeError
from worker.api.realtime.events import AudioFormatIn, SessionIn, TurnDetectionIn, VoiceId
from worker.api.realtime.g711 import FORMATS, PCM
from worker.contract.pipeline import AUDIO_OUTPUT_RATE

PCM_RATE = AUDIO_OUTPUT_RATE  # input and output audio on the wire: PCM16 mono at 24 kHz
PCM_FORMAT = {"type": "audio/pcm", "rate": PCM_RATE}


@dataclass(frozen=True)
class Eagerness:
    """What ``semantic_vad``'s ``eagerness`` picks (SGLang-Omni's scheme: worker/api/realtime/
    turns.py): after a pause of ``PAUSE_MS``, Smart Turn scores whether the turn is complete;
    at ``complete`` or more, ``complete_ms`` of silence ends it, else ``longest_ms`` does
    (``silence_duration_ms``, when the session sets it)."""

    complete: float
    complete_ms: int
    longest_ms: int


EAGERNESS = {
    "low": Eagerness(0.85, 600, 3000),
    "medium": Eagerness(0.7, 300, 2000),
    "auto": Eagerness(0.7, 300, 2000),
    "high": Eagerness(0.5, 200, 1000),
}


class VadConfig(BaseModel):
    type: str = "server_vad"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    eagerness: str | None = None  # semantic_vad's (low, medium, high, auto)
    create_response: bool = True
    interrupt_response: bool = True

    def patched(self, given: TurnDetectionIn) -> VadConfig:
        changes = given.model_dump(exclude_none=True, exclude={"type"})
        if given.type == "semantic_vad":
            eagerness = given.eagerness or "auto"
            changes["eagerness"] = eagerness
            if given.silence_duration_ms is None:
                changes["silence_duration_ms"] = EAGERNESS[eagerness].longest_ms
        elif given.eagerness is not None:
            raise RealtimeError(
                Code.INVALID_REQUEST,
                "eagerness is semantic_vad's: server_vad ends a turn after silence_duration_ms",
                "session.audio.input.turn_detection.eagerness",
            )
        else:
            changes["eagerness"] = None
            if self.type != "server_vad" and given.silence_duration_ms is None:
                changes["silence_duration_ms"] = VadConfig().silence_duration_ms
        return self.model_copy(update={"type": given.type, **changes})


REALTIME, TRANSCRIPTION = "realtime", "transcription"  # a session's type, set when it opens
# what a transcription session's session.update may set (OpenAI's transcription session)
_TRANSCRIPTION_FIELDS = frozenset({"type", "audio", "include", "input_audio_format",
                                   "input_audio_transcription", "turn_detection"})  # fmt: skip


class SessionConfig(BaseModel):
    # "transcription" (``/v1/realtime?intent=transcription``): committed audio is transcribed,
    # no response is made
    type: str = REALTIME
    instructions: str = ""
    output_modalities: list[str] = Field(default_factory=lambda: ["audio"])
    voice: str | None = None
    turn_detection: VadConfig | None = Field(default_factory=VadConfig)
    transcription: dict | None = None  # set: committed user audio is transcribed as well
    input_format: str = PCM
    output_format: str = PCM
    max_output_tokens: int | None = None
    temperature: float | None = None  # None or 0: greedy
    top_p: float | None = None
    seed: int | None = None  # None: each response draws its own
    # function calling: the GA tools ({type, name, description, parameters}) and the choice
    tools: list[dict] = Field(default_factory=list)
    tool_choice: str | dict = "auto"

    @property
    def wants_audio(self) -> bool:
        return "audio" in self.output_modalities


_BETA_FORMATS = {"pcm16": PCM, "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}
_BETA_NAMES = {v: k for k, v in _BETA_FORMATS.items()}


def format_name(fmt: AudioFormatIn | str | None, param: str) -> str | None:
    """A client's audio format -> one of ``g711.FORMATS`` (None: not given). PCM travels at
    24 kHz only; G.711 at its 8 kHz."""
    if fmt is None:
        return None
    if isinstance(fmt, str):
        return _BETA_FORMATS[fmt]  # the event model allows only these
    if fmt.type in FORMATS and (fmt.type != PCM or fmt.rate in (None, PCM_RATE)):
        return fmt.type
    raise RealtimeError(
        Code.UNSUPPORTED_AUDIO_FORMAT,
        f"audio format {fmt.model_dump(exclude_none=True)} is not served; use {PCM_FORMAT}, "
        "audio/pcmu or audio/pcma (beta: 'pcm16', 'g711_ulaw', 'g711_alaw')",
        param,
    )


def format_view(fmt: str) -> dict:
    return PCM_FORMAT if fmt == PCM else {"type": fmt}


def voice_name(voice: str | VoiceId | None) -> str | None:
    return voice.id if isinstance(voice, VoiceId) else voice


def modalities(given: Sequence[str] | None) -> list[str] | None:
    """GA takes ["text"] or ["audio"] (audio comes with its transcript); beta's
    ["text", "audio"] is GA's ["audio"]."""
    if given is None:
        return None
    return ["audio"] if "audio" in given else ["text"]


def max_tokens(given: int | str | None) -> int | None:
    return given if isinstance(given, int) else None


def apply(config: SessionConfig, update: SessionIn) -> tuple[SessionConfig, str | None]:
    """The config after ``update``, and the voice it names (the caller checks the voice).
    Raises ``RealtimeError`` for what this server cannot do; ``config`` is then unchanged."""
    if update.type is not None and update.type != config.type:
        raise RealtimeError(
            Code.INVALID_REQUEST,
            f"this is a {config.type} session and stays one (a transcription session is opened "
            "with /v1/realtime?intent=transcription)",
            "session.type",
        )
    audio = update.audio
    if config.type == TRANSCRIPTION:  # only what transcribing takes
        extra = sorted(update.model_fields_set - _TRANSCRIPTION_FIELDS)
        if audio is not None and audio.output is not None:
            extra.insert(0, "audio.output")
        if extra:
            raise RealtimeError(
                Code.INVALID_REQUEST,
                f"a transcription session makes no responses: {extra[0]} is not one of its "
                "settings (audio.input's format, transcription, turn_detection)",
                f"session.{extra[0]}",
            )
    changes: dict = {}
    formats = (
        ("input_format", audio.input.format if audio and audio.input else None, "audio.input"),
        ("output_format", audio.output.format if audio and audio.output else None, "audio.output"),
        ("input_format", update.input_audio_format, "input_audio_format"),
        ("output_format", update.output_audio_format, "output_audio_format"),
    )
    for field, fmt, param in formats:
        name = format_name(fmt, f"session.{param}.format")
        if name is not None:
            changes[field] = name
    if update.instructions is not None:
        changes["instructions"] = update.instructions
    for name in ("temperature", "top_p", "seed"):
        if getattr(update, name) is not None:
            changes[name] = getattr(update, name)
    if update.tools is not None:
        changes["tools"] = [t.model_dump(exclude_none=True) for t in update.tools]
    if update.tool_choice is not None:
        choice = update.tool_choice
        changes["tool_choice"] = choice if isinstance(choice, str) else choice.model_dump()
    chosen = modalities(update.output_modalities or update.modalities)
    if chosen is not None:
        changes["output_modalities"] = chosen
    voice = voice_name(audio.output.voice if audio and audio.output else None) or update.voice
    # turn detection: given as null turns it off; left out keeps it
    for holder in (audio.input if audio else None, update):
        if holder is not None and "turn_detection" in holder.model_fields_set:
            detection = holder.turn_detection
            base = config.turn_detection or VadConfig()
            changes["turn_detection"] = None if detection is None else base.patched(detection)
    for holder, name in (
        (audio.input if audio else None, "transcription"),
        (update, "input_audio_transcription"),
    ):
        if holder is not None and name in holder.model_fields_set:
            given = getattr(holder, name)
            if given is None and config.type == TRANSCRIPTION:
                raise RealtimeError(
                    Code.INVALID_REQUEST,
                    "a transcription session transcribes: its transcription cannot be null",
                    f"session.{'audio.input.' if name == 'transcription' else ''}{name}",
                )
            changes["transcription"] = (
                None if given is None else given.model_dump(exclude_none=True)
            )
    limit = update.max_output_tokens or update.max_response_output_tokens
    if limit is not None:
        changes["max_output_tokens"] = max_tokens(limit)
    return config.model_copy(update=changes), voice


def session_view(config: SessionConfig, session_id: str, model: str, beta: bool) -> dict:
    vad = config.turn_detection.model_dump(exclude_none=True) if config.turn_detection else None
    if config.type == TRANSCRIPTION:  # OpenAI's transcription session (GA only)
        if vad is not None:  # (it makes no responses to create or interrupt)
            vad = {k: v for k, v in vad.items() if not k.endswith("_response")}
        return {
            "id": session_id,
            "object": "realtime.transcription_session",
            "type": TRANSCRIPTION,
            "audio": {
                "input": {
                    "format": format_view(config.input_format),
                    "transcription": config.transcription,
                    "turn_detection": vad,
                    "noise_reduction": None,
                }
            },
            "include": [],
        }
    limit = config.max_output_tokens or "inf"
    common = {"id": session_id, "object": "realtime.session", "model": model}
    if beta:
        return {
            **common,
            "modalities": ["text", "audio"] if config.wants_audio else ["text"],
            "instructions": config.instructions,
            "voice": config.voice,
            "input_audio_format": _BETA_NAMES[config.input_format],
            "output_audio_format": _BETA_NAMES[config.output_format],
            "turn_detection": vad,
            "input_audio_transcription": config.transcription,
            "max_response_output_tokens": limit,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "seed": config.seed,
            "tools": config.tools,
            "tool_choice": config.tool_choice,
        }
    return {
        **common,
        "type": "realtime",
        "instructions": config.instructions,
        "output_modalities": config.output_modalities,
        "audio": {
            "input": {
                "format": format_view(config.input_format),
                "turn_detection": vad,
                "transcription": config.transcription,
            },
            "output": {"format": format_view(config.output_format), "voice": config.voice},
        },
        "max_output_tokens": limit,
        "temperature": config.temperature,
        "top_p": config.top_p,
        "seed": config.seed,
        "tools": config.tools,
        "tool_choice": config.tool_choice,
    }
