"""Audio on the wire: decode uploads (validated, mono, resampled) and encode wav / pcm16."""

from __future__ import annotations

import base64
import binascii
import io
import struct

import numpy as np
import soundfile as sf

from fleet.errors import ErrorCode, OmniError
from worker.engine import AUDIO_INPUT_RATE, AUDIO_OUTPUT_RATE

# Formats we answer in (OpenAI names; "pcm16" is the chat spelling of "pcm").
OUTPUT_FORMATS = ("wav", "pcm", "pcm16")
STREAMING_WAV_SIZE = 0xFFFFFFFF  # "unknown length": what streaming wav players expect


def invalid_audio(message: str, param: str | None) -> OmniError:
    return OmniError(400, ErrorCode.INVALID_AUDIO, message, param)


def b64decode(data: str, param: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid_audio(f"audio is not valid base64: {exc}", param) from exc


def resample(audio: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Linear interpolation: plenty for speech features, deterministic, numpy only."""
    if rate == target or audio.size == 0:
        return audio.astype(np.float32, copy=False)
    n_out = max(1, round(audio.size * target / rate))
    positions = np.arange(n_out, dtype=np.float64) * (rate / target)
    return np.interp(positions, np.arange(audio.size), audio).astype(np.float32)


def decode_audio(
    data: bytes,
    *,
    max_seconds: float,
    param: str | None = "file",
    target_rate: int = AUDIO_INPUT_RATE,
) -> np.ndarray:
    """Any format libsndfile reads (wav, flac, ogg, mp3) -> mono float32 at ``target_rate``.

    The length is checked from the header before the samples are decoded, so an hour-long
    upload is refused without decoding it.
    """
    if not data:
        raise invalid_audio("audio is empty", param)
    try:
        info = sf.info(io.BytesIO(data))
    except Exception as exc:  # libsndfile raises several types for garbage
        raise invalid_audio(f"audio could not be decoded: {exc}", param) from exc
    if info.samplerate <= 0 or info.frames <= 0:
        raise invalid_audio("audio has no samples", param)
    seconds = info.frames / info.samplerate
    if seconds > max_seconds:
        raise OmniError(
            400,
            ErrorCode.AUDIO_TOO_LONG,
            f"audio is {seconds:.1f}s long; this worker accepts at most {max_seconds:g}s",
            param,
        )
    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except Exception as exc:
        raise invalid_audio(f"audio could not be decoded: {exc}", param) from exc
    if samples.size == 0:
        raise invalid_audio("audio has no samples", param)
    mono = samples.mean(axis=1)
    if not np.isfinite(mono).all():
        raise invalid_audio("audio contains NaN or infinite samples", param)
    return resample(mono, rate, target_rate)


def wav_header(data_bytes: int | None, rate: int = AUDIO_OUTPUT_RATE, channels: int = 1) -> bytes:
    """A 44-byte PCM16 RIFF header; ``None`` for a stream whose length is not known yet."""
    size = STREAMING_WAV_SIZE if data_bytes is None else data_bytes
    riff = STREAMING_WAV_SIZE if data_bytes is None else 36 + data_bytes
    block = channels * 2
    return (
        b"RIFF" + struct.pack("<I", riff) + b"WAVE"
        + b"fmt " + struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * block, block, 16)
        + b"data" + struct.pack("<I", size)
    )  # fmt: skip


def encode(pcm16: bytes, fmt: str, rate: int = AUDIO_OUTPUT_RATE) -> bytes:
    """A whole response body in ``fmt`` (wav or raw little-endian pcm16)."""
    if fmt == "wav":
        return wav_header(len(pcm16), rate) + pcm16
    return pcm16


def media_type(fmt: str) -> str:
    return "audio/wav" if fmt == "wav" else f"audio/pcm;rate={AUDIO_OUTPUT_RATE};encoding=s16le"


def pcm16_seconds(pcm16: bytes, rate: int = AUDIO_OUTPUT_RATE) -> float:
    return len(pcm16) / 2 / rate
