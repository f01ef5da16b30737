"""The wire's audio formats: PCM16 at 24 kHz (``audio/pcm``), and G.711 telephony audio
(``audio/pcmu`` = mu-law, ``audio/pcma`` = A-law: 8 kHz, a byte per sample), what phone
gateways stream. G.711 decodes through a table of its 256 codes (ITU-T G.711, the values of
Python's audioop); encoding picks the code nearest each sample (the reference encoder truncates;
the nearest code is never farther)."""

from __future__ import annotations

import numpy as np

from worker.api import audio
from worker.contract.pipeline import AUDIO_OUTPUT_RATE

G711_RATE = 8_000
PCM_RATE = AUDIO_OUTPUT_RATE


def _ulaw_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent, mantissa = (u >> 4) & 0x07, u & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(u & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    exponent, mantissa = (a >> 4) & 0x07, a & 0x0F
    magnitude = np.where(
        exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0)
    )
    return np.where(a & 0x80, magnitude, -magnitude).astype(np.int16)


class Codec:
    def __init__(self, table: np.ndarray) -> None:
        self.table = table
        # ties (mu-law's two zeros) go to the higher code: 0xFF, what encoders emit for 0
        self.order = np.lexsort((-np.arange(256), table))
        self.sorted = table[self.order].astype(np.int32)

    def decode(self, data: bytes) -> bytes:
        """G.711 bytes at 8 kHz -> PCM16 at 24 kHz."""
        pcm8k = self.table[np.frombuffer(data, dtype=np.uint8)].astype(np.float32) / 32767.0
        return audio.to_pcm16(audio.resample(pcm8k, G711_RATE, PCM_RATE))

    def encode(self, pcm16: bytes) -> bytes:
        """PCM16 at 24 kHz -> G.711 bytes at 8 kHz."""
        samples = audio.resample(audio.from_pcm16(pcm16), PCM_RATE, G711_RATE)
        x = np.clip(np.round(samples * 32767.0), -32768, 32767).astype(np.int32)
        right = np.clip(np.searchsorted(self.sorted, x), 1, len(self.sorted) - 1)
        nearer_left = (x - self.sorted[right - 1]) <= (self.sorted[right] - x)
        return self.order[right - nearer_left].astype(np.uint8).tobytes()


PCM = "audio/pcm"
CODECS = {"audio/pcmu": Codec(_ulaw_table()), "audio/pcma": Codec(_alaw_table())}
FORMATS = (PCM, *CODECS)


def to_pcm(fmt: str, data: bytes) -> bytes:
    """Audio in ``fmt`` -> PCM16 at 24 kHz."""
    return data if fmt == PCM else CODECS[fmt].decode(data)


def from_pcm(fmt: str, pcm16: bytes) -> bytes:
    """PCM16 at 24 kHz -> audio in ``fmt``."""
    return pcm16 if fmt == PCM else CODECS[fmt].encode(pcm16)
