"""What stages stream to each other (``CHUNK`` along ``stream_to`` edges), typed.

A payload crosses processes as it is (``worker.runtime.transport`` packs dataclasses, their
large arrays through shared memory; torch tensors arrive as numpy arrays). A family that
streams more than these subclasses them (Qwen3-Omni's ``ThinkerPiece``), so that a generic
stage downstream reads what it knows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# one token's log probability with its likeliest rivals: (logprob, [(token id, logprob)])
TokenLogprobs = tuple[float, list[tuple[int, float]]]


@dataclass(slots=True)
class TokenPiece:
    """A piece of a reply from an autoregressive stage: one token, or a given reply whole (to
    decode, and to a talker)."""

    tokens: list[int]
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # per token, when asked
    # the reply's first piece: its prompt's tokens and those the prefix cache served
    prompt_tokens: int | None = None
    cached_tokens: int = 0


@dataclass(slots=True)
class CodeFrames:
    """Codec frames from a talker to its vocoder: int64 (frames, code groups).
    ``context``: a cloned voice's reference frames, decoded before the reply's own (as the
    model decodes a clone) and never heard."""

    codes: Any
    context: bool = False


@dataclass(slots=True)
class TextPiece:
    """More of a speech request's text as the client writes it (to the talker)."""

    text: str


@dataclass(slots=True)
class AlignClips:
    """What an aligner stage times word by word: clips of one request, each (mono float32
    audio at 16 kHz, its text, where it starts in the whole audio in seconds)."""

    clips: list[tuple[Any, str, float]]
    # times past the audio's end are cut to it (speech: the audio holds exactly what was said)
    within_audio: bool = False


@dataclass(slots=True)
class SpokenText:
    """The whole text a talker spoke (its streamed rest included), for an aligner."""

    text: str


@dataclass(slots=True)
class SpokenAudio:
    """The whole audio a vocoder made of one request, int16 mono at ``rate`` Hz, for an
    aligner (sent only when the request asks for word timestamps)."""

    pcm: Any
    rate: int


@dataclass(slots=True)
class PromptIds:
    """A plain language model's prompt as token ids (its chat template applied), from its
    preprocessing to its decoder."""

    input_ids: list[int]


@dataclass(slots=True)
class Gathered:
    """The final payloads of several stages, as an aggregate stage passes them on together
    (``worker.stages.aggregate``); a stage after it finds each by its type
    (``worker.stages.base.input_of``)."""

    parts: list[Any]
