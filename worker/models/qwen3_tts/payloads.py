"""What Qwen3-TTS's preprocessing hands its talker: the request checked against the checkpoint
and, for a cloned voice, its reference audio turned into what the model takes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class TalkerInput:
    text: str  # the text to speak (of a streamed text: empty; it comes as ``TextPiece``s)
    language: str = "auto"  # a ``codec_language_id`` key, or "auto"
    text_follows: bool = False  # the text is streamed in (``GenerationRequest.text_stream``)
    instruct: str | None = None  # the request's ``instructions`` (checkpoints that follow them)
    speaker: str | None = None  # a built-in voice (``spk_id``, lower case)
    # a cloned voice (Base checkpoints): its 24 kHz reference audio, the content hash under
    # which the stages keep what they compute of it (``voice_cache``), and with its transcript
    # the reference codes from the speech tokenizer's encoder
    ref_wav: np.ndarray | None = None
    voice_key: str | None = None
    ref_text: str | None = None
    ref_codes: np.ndarray | None = None
    max_new: int | None = None  # a cap below the talker's frame budget (warm-up, tests)
