"""The input audio buffer: PCM16 mono at 24 kHz as the client appends it (base64), bounded,
addressed by absolute sample positions since the session began (what ``audio_start_ms`` and
``audio_end_ms`` count)."""

from __future__ import annotations

import numpy as np

from fleet.errors import OmniError
from worker.api import audio
from worker.api.realtime import g711
from worker.api.realtime.config import PCM_RATE
from worker.api.realtime.errors import Code, RealtimeError
from worker.contract.pipeline import AUDIO_INPUT_RATE


def decode_input(data: str, fmt: str, param: str = "audio") -> bytes:
    """base64 audio in the session's input format -> PCM16 at 24 kHz."""
    if fmt == g711.PCM:
        return decode_pcm16(data, param)
    try:
        raw = audio.b64decode(data, param)
    except OmniError as exc:
        raise RealtimeError.from_omni(exc) from exc
    return g711.to_pcm(fmt, raw)


def decode_pcm16(data: str, param: str = "audio") -> bytes:
    """base64 PCM16 -> bytes; ``invalid_audio`` for bad base64 or a torn sample."""
    try:
        raw = audio.b64decode(data, param)
    except OmniError as exc:
        raise RealtimeError.from_omni(exc) from exc
    if len(raw) % 2:
        raise RealtimeError(
            Code.INVALID_AUDIO,
            f"PCM16 audio has 2 bytes per sample; got {len(raw)} bytes (an odd count)",
            param,
        )
    return raw


def to_model_rate(pcm16: bytes) -> np.ndarray:
    """24 kHz PCM16 -> float32 at the rate the audio encoder takes."""
    return audio.resample(audio.from_pcm16(pcm16), PCM_RATE, AUDIO_INPUT_RATE)


def ms(samples: int) -> int:
    return samples * 1000 // PCM_RATE


class InputAudioBuffer:
    def __init__(self, max_seconds: float) -> None:
        self.max_bytes = int(max_seconds * PCM_RATE) * 2
        self.pcm = bytearray()
        self.base = 0  # absolute sample position of pcm[0]

    @property
    def end(self) -> int:
        """Absolute sample position just past the buffered audio."""
        return self.base + len(self.pcm) // 2

    def append(self, pcm16: bytes) -> None:
        if len(self.pcm) + len(pcm16) > self.max_bytes:
            seconds = self.max_bytes / 2 / PCM_RATE
            raise RealtimeError(
                Code.INPUT_AUDIO_BUFFER_FULL,
                f"the input audio buffer holds at most {seconds:g}s; commit or clear it "
                "(this append was dropped)",
                "audio",
            )
        self.pcm += pcm16

    def take(self, start: int | None = None, end: int | None = None) -> bytes:
        """The audio in [start, end) (absolute samples; default: all of it); the buffer then
        keeps only what came after ``end``."""
        lo = max(0, (start if start is not None else self.base) - self.base)
        hi = max(lo, (end if end is not None else self.end) - self.base)
        taken = bytes(self.pcm[lo * 2 : hi * 2])
        del self.pcm[: hi * 2]
        self.base += hi
        return taken

    def clear(self) -> None:
        self.take()
