"""What the entry stage of a pipeline receives of a request (``RequestInput``), with each
endpoint's options as typed fields: the coordinator builds it from the API's
``GenerationRequest`` and the family's preprocessing reads it. Its arrays cross processes in
shared memory like any payload's (``worker.runtime.transport``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class SpeechOptions:
    """A Qwen3-TTS request's options (``/v1/audio/speech``, realtime on a TTS spec)."""

    language: str | None = None  # None: the model decides ("auto")
    instructions: str | None = None  # how to speak (instruct checkpoints)
    # an uploaded voice: its transcript (cloning with reference codes) and its content hash,
    # under which its codes and speaker embedding are computed once (qwen3_tts.voice_cache)
    ref_text: str | None = None
    voice_key: str | None = None


@dataclass(frozen=True, slots=True)
class TranscriptionOptions:
    """A Qwen3-ASR request's options (``/v1/audio/transcriptions``)."""

    language: str | None = None  # None: detected
    prompt: str | None = None  # context the decoder reads before the audio
    timestamps: bool = False  # word timestamps from the forced aligner
    translate: bool = False  # /v1/audio/translations: English text, whatever the audio's language


@dataclass(slots=True)
class RequestInput:
    kind: str  # RequestKind value: chat, completion, speech, transcription
    # chat: OpenAI-style messages, media parts decoded (worker.api.chat)
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict] | None = None  # chat: the functions the prompt offers
    text: str = ""  # speech: what to say; completion: the prompt
    text_follows: bool = False  # speech: more text streams in after ``text`` (to the talker)
    prompt_ids: list[int] | None = None  # completion: the prompt as token ids (instead of text)
    audio: Any = None  # transcription: mono float32 at 16 kHz
    voice: str | None = None  # a built-in speaker, or an uploaded voice's name
    voice_audio: Any = None  # an uploaded voice's reference audio (float32)
    max_tokens: int | None = None
    output_audio: bool = False
    speech: SpeechOptions | None = None
    transcription: TranscriptionOptions | None = None
