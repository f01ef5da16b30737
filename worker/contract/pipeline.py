"""The seam between the HTTP layer and the pipeline runtime.

The API layer turns an HTTP request into a ``GenerationRequest`` and consumes the events that
``Pipeline.generate`` yields. Cancelling the consuming task (client disconnect) or closing the
iterator aborts the request in every stage and frees its memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

import numpy as np

from fleet.records import ProcessMemory
from worker.contract.grammar import Grammar
from worker.contract.options import SpeechOptions, TranscriptionOptions
from worker.contract.sampling import Sampling


class RequestKind(StrEnum):
    CHAT = "chat"
    COMPLETION = "completion"  # a text prompt continued as it is (no chat template)
    SPEECH = "speech"
    TRANSCRIPTION = "transcription"


_TEXT, _AUDIO, _TEXT_AUDIO = frozenset({"text"}), frozenset({"audio"}), frozenset({"text", "audio"})


def outputs_of(
    kind: RequestKind, output_audio: bool = False, words: bool = False
) -> frozenset[str]:
    """What a request of this kind produces (the stages it visits follow from it); ``words``:
    speech with the word timestamps of the synthesized audio."""
    if kind == RequestKind.SPEECH:
        return _AUDIO | {"words"} if words else _AUDIO
    if kind == RequestKind.TRANSCRIPTION:
        return _TEXT
    return _TEXT_AUDIO if output_audio else _TEXT


@dataclass(slots=True)
class GenerationRequest:
    request_id: str
    kind: RequestKind
    # chat: OpenAI-style messages whose content is text or a list of parts in order (text,
    # and audio, image, video decoded: worker.api.chat); `audio` is a transcription's clip
    messages: list[dict] = field(default_factory=list)
    text: str = ""  # speech: the text to speak; completion: the prompt
    # speech on Qwen3-TTS: the rest of the text as it is written (``text`` is its start); the
    # talker reads it in the model's streaming-text mode and the iterator's end ends it
    text_stream: AsyncIterator[str] | None = None
    prompt_ids: list[int] | None = None  # completion: the prompt as token ids (instead of text)
    audio: np.ndarray | None = None  # mono float32 at AUDIO_INPUT_RATE (input audio)
    output_audio: bool = False  # chat with modalities ["text", "audio"], and all speech
    voice: str | None = None  # a built-in speaker, or an uploaded voice's name
    voice_audio: np.ndarray | None = None  # reference audio of an uploaded voice (float32)
    max_tokens: int | None = None
    session_id: str | None = None
    sampling: Sampling | None = None  # chat: how the thinker picks tokens (None: greedy)
    # speech out: how the talker picks codes (None: the checkpoint's own sampling, unseeded)
    speech_sampling: Sampling | None = None
    stop: tuple[str, ...] = ()  # chat: texts that end the reply (cut before them)
    logprobs: int | None = None  # chat: None, or the alternatives per token (top_logprobs)
    grammar: Grammar | None = None  # chat: the response_format the reply must fit
    tools: list[dict] | None = None  # chat: the functions the prompt offers (worker.api.tools)
    speech: SpeechOptions | None = None  # speech on Qwen3-TTS: language, instructions, clone
    # speech: the synthesized audio's words with their times (WordTimings), from the spec's
    # aligner stage (``only_for_output: [words]``)
    word_timestamps: bool = False
    transcription: TranscriptionOptions | None = None  # transcription on Qwen3-ASR


AUDIO_INPUT_RATE = 16_000  # Hz, what encoders consume
AUDIO_OUTPUT_RATE = 24_000  # Hz, what the vocoder produces (mono, int16 PCM on the wire)


@dataclass(slots=True)
class TokenLogprob:
    token: str
    logprob: float
    top: list[tuple[str, float]] = field(default_factory=list)  # likeliest tokens, theirs


@dataclass(slots=True)
class TextDelta:
    text: str
    logprobs: list[TokenLogprob] | None = None  # the tokens of this text, when asked for


@dataclass(slots=True)
class AudioChunk:
    pcm16: bytes  # little-endian int16 mono at AUDIO_OUTPUT_RATE


@dataclass(slots=True)
class ClipStart:
    """A transcription's next clip (Qwen3-ASR cuts long audio near pauses): the language the
    model wrote for it and where it lies in the audio, in seconds; its text follows."""

    language: str
    start: float
    end: float


def merge_languages(languages: list[str]) -> str:
    """A transcription's language: its clips' (``ClipStart.language``) in order, empty ones
    and repeats in a row dropped: "Chinese,English" (as qwen-asr merges them)."""
    out: list[str] = []
    for lang in languages:
        lang = (lang or "").strip()
        if lang and (not out or out[-1] != lang):
            out.append(lang)
    return ",".join(out)


@dataclass(slots=True)
class WordTimings:
    """The forced aligner's word timestamps of a transcription: (word, start, end) in seconds."""

    words: list[tuple[str, float, float]]


@dataclass(slots=True)
class Finished:
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the engine's prefix cache served
    # speech: the input text's positions (its tokens, then end-of-text) the talker read; each
    # is read once (None: no talker ran)
    text_tokens_read: int | None = None


Event = TextDelta | AudioChunk | ClipStart | WordTimings | Finished


class StageFailed(Exception):
    """A stage process died or errored while the request was in flight (HTTP 503)."""


class RequestInvalid(StageFailed):
    """A stage refused the request's content (unknown voice, prompt over the context length,
    audio for a model without an audio encoder, ...): a client error (HTTP 400), not a failure.
    A ``StageFailed`` so that handlers which only know that one still catch it."""


@dataclass(slots=True)
class StageLoad:
    queue_depth: int = 0  # waiting + running requests
    busy: float = 0.0  # fraction of recent wall time spent computing, 0..1


@dataclass(slots=True)
class PipelineStatus:
    ready: bool
    healthy: bool
    stages: dict[str, StageLoad]
    detail: str = ""  # e.g. "restarting process group talker"
    memory: dict[str, ProcessMemory] = field(default_factory=dict)  # per stage process


ProgressCallback = Callable[[str], None]


class Pipeline(Protocol):
    async def start(self, progress: ProgressCallback) -> None:
        """Launch every process of the plan; return once every stage reported ready."""

    def generate(self, request: GenerationRequest) -> AsyncIterator[Event]:
        """Run one request through the pipeline. Raises ``StageFailed`` if a stage dies."""

    def status(self) -> PipelineStatus: ...

    def speakers(self) -> list[str]:
        """Built-in voice names."""

    def follows_instructions(self) -> bool:
        """Whether the checkpoint follows a speech request's ``instructions``."""

    def designed_voice(self) -> str | None:
        """The built-in voice that a request's instructions design (a VoiceDesign checkpoint),
        which speaks the voices created from prompts; None where the checkpoint cannot."""

    def stage_limits(self, outputs: frozenset[str]) -> dict[str, int]:
        """The autoregressive stages that a request for ``outputs`` waits in, each with the
        requests it takes at once over every replica (running and queued, as the spec and the
        plan say): admission refuses one more."""

    async def stop(self) -> None:
        """Stop every stage process (in-flight requests are the caller's to drain first)."""
