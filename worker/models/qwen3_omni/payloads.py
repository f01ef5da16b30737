"""What Qwen3-Omni's stages hand each other: the processor's prompt (preprocessing -> the
encoders, the thinker and the talker), the encoders' embeddings (-> the thinker), and what the
thinker streams to the talker beside what decode reads of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from worker.stages.payloads import TokenPiece


@dataclass(slots=True)
class OmniPrompt:
    """A request's prompt as ``Qwen3OmniMoeProcessor`` makes it (``processor.OmniProcessor``):
    token ids with each media placeholder expanded to one token per encoder output, and the
    media the encoders take; the voice a spoken reply is in (None: the talker's default) and,
    for a speech request, the reply's tokens (spoken as given, not generated)."""

    input_ids: list[int]
    audio_features: np.ndarray | None = None  # (mel bins, frames of all clips), as the tower takes
    audio_lens: list[int] = field(default_factory=list)  # feature frames per clip
    pixel_values: np.ndarray | None = None  # (patches, channels x patch volume)
    image_grid: np.ndarray | None = None  # (images, 3): t, h, w in patches
    video_values: np.ndarray | None = None  # video patches, the same layout
    video_grid: np.ndarray | None = None  # (videos, 3)
    video_seconds: list[float] = field(default_factory=list)  # seconds per temporal patch
    voice: str | None = None
    forced_ids: list[int] | None = None


@dataclass(slots=True)
class MediaEmbeddings:
    """An encoder's outputs for one request's media, in prompt order, on the encoder's device
    (a thinker in the same process takes them as they are): the audio tower's, the vision
    tower's merged tokens and deepstack features ``(layers, tokens, hidden)`` of its images and
    of its video frames. None: the request has none of that medium."""

    audio: Any = None
    image: Any = None
    image_deepstack: Any = None
    video: Any = None
    video_deepstack: Any = None

    @classmethod
    def merged(cls, parts: list[MediaEmbeddings]) -> MediaEmbeddings:
        """One request's embeddings from several encoders (each medium from the one that has
        it)."""
        out = cls()
        for part in parts:
            for name in cls.__slots__:
                value = getattr(part, name)
                if value is not None:
                    setattr(out, name, value)
        return out


@dataclass(slots=True)
class TalkerPrompt:
    """What the talker's prompt is built from, one row per prompt position: the thinker's token
    embeddings and its hidden states at the talker's ``accept_hidden_layer``; and the
    embeddings of the three speech control tokens (tts_bos, tts_eos, tts_pad)."""

    embeds: Any
    hidden: Any
    tts_embeds: Any


@dataclass(slots=True)
class ThinkerPiece(TokenPiece):
    """A piece of the thinker's reply: to decode its tokens, to a talker also their embeddings
    and, with the reply's first piece, the prompt's states."""

    embeds: Any = None  # (tokens, hidden size); None without a talker
    talker_prompt: TalkerPrompt | None = None
