"""What Qwen3-Omni's thinker streams to the talker, beside what decode reads of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.stages.payloads import TokenPiece


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
