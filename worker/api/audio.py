"""Audio on the wire: decode uploads (validated, mono, resampled) and encode wav / pcm16."""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import io
import struct
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar

import numpy as np
import soundfile as sf

from fleet.errors import ErrorCode, OmniError
from worker.contract.pipeline import AUDIO_INPUT_RATE, AUDIO_OUTPUT_RATE
from worker.layers.resample import resample

# Formats we answer in (OpenAI names; "pcm16" is the chat spelling of "pcm").
OUTPUT_FORMATS = ("wav", "pcm", "pcm16")
STREAMING_WAV_SIZE = 0xFFFFFFFF  # "unknown length": what streaming wav players expect

DEFAULT_MAX_DECODED_BYTES = 256 * 2**20  # float32: over 11 minutes of 48 kHz stereo
DEFAULT_DECODE_THREADS = 2
# The decoded-size limit of the worker serving the current request (set per request by
# worker.api.app, so routes that call decode_audio without one get their worker's own).
DECODED_BYTES_LIMIT: ContextVar[int] = ContextVar(
    "audio_decoded_bytes_limit", default=DEFAULT_MAX_DECODED_BYTES
)
_BLOCK_SAMPLES = 1 << 18  # samples (all channels) decoded per block: 1 MB of float32
_UNKNOWN_FRAMES = 1 << 62  # libsndfile's frame count for "not in the header" (SF_COUNT_MAX)


def invalid_audio(message: str, param: str | None) -> OmniError:
    return OmniError(400, ErrorCode.INVALID_AUDIO, message, param)


def b64decode(data: str, param: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise invalid_audio(f"audio is not valid base64: {exc}", param) from exc


def _decode_failed(exc: Exception, param: str | None) -> OmniError:
    # libsndfile's own message names the Python object it read from ("<_io.BytesIO object at
    # 0x...>"): keep only its reason.
    reason = getattr(exc, "error_string", None) or type(exc).__name__
    return invalid_audio(
        f"audio could not be decoded ({reason.rstrip('.')}); send wav, flac, mp3 or ogg (vorbis, "
        "opus)",
        param,
    )


def _too_large(rate: int, channels: int, seconds: float, limit: int, param: str | None):
    size = rate * channels * seconds * 4
    return OmniError(
        400,
        ErrorCode.AUDIO_TOO_LARGE,
        f"audio decodes to {size / 2**20:,.0f} MiB ({rate} Hz x {channels} channel(s) x "
        f"{seconds:.1f} s as float32); this worker decodes at most {limit / 2**20:,.0f} MiB: "
        "send fewer channels or a lower sample rate (16 kHz mono is what it uses)",
        param,
    )


def _too_long(seconds: float, max_seconds: float, param: str | None) -> OmniError:
    return OmniError(
        400,
        ErrorCode.AUDIO_TOO_LONG,
        f"audio is {seconds:.1f}s long; this worker accepts at most {max_seconds:g}s",
        param,
    )


def decode_audio(
    data: bytes,
    *,
    max_seconds: float,
    param: str | None = "file",
    target_rate: int = AUDIO_INPUT_RATE,
    max_decoded_bytes: int | None = None,
    container: str | None = None,
) -> np.ndarray:
    """Any format libsndfile reads (wav, flac, ogg vorbis/opus, mp3) -> mono float32 at
    ``target_rate``; with ``container`` (a client's declared format: wav, flac, ogg, mp3), only
    that one. Blocking: on the event loop call ``decode_audio_async``.

    Length and decoded size (rate x channels x seconds) are checked from the header before a
    sample is decoded, so a 100 KB file of 8-channel 192 kHz silence is refused for nothing.
    Headers can lie: decoding never goes past the header's length (a file without one is
    refused), block by block, each block down-mixed at once into the mono result, so memory
    stays near that result whatever the channel count.
    ``max_decoded_bytes`` defaults to the limit of the worker serving this request.
    """
    if not data:
        raise invalid_audio("audio is empty", param)
    limit = DECODED_BYTES_LIMIT.get() if max_decoded_bytes is None else max_decoded_bytes
    try:
        source = sf.SoundFile(io.BytesIO(data))
    except Exception as exc:  # libsndfile raises several types for garbage
        raise _decode_failed(exc, param) from exc
    with source:
        if container is not None and source.format.lower() != container:
            raise invalid_audio(
                f"audio is {source.format.lower()}, not the {container} its format says",
                f"{param}.format" if param else None,
            )
        rate, channels, frames = source.samplerate, source.channels, source.frames
        if rate <= 0 or channels <= 0 or frames <= 0:
            raise invalid_audio("audio has no samples", param)
        if frames >= _UNKNOWN_FRAMES:
            raise invalid_audio("audio header gives no length; send a complete file", param)
        seconds = frames / rate
        if seconds > max_seconds:
            raise _too_long(seconds, max_seconds, param)
        if frames * channels * 4 > limit:
            raise _too_large(rate, channels, seconds, limit, param)
        # One mono array of the header's length, filled block by block: memory is the mono
        # result plus one block, whatever the channel count. soundfile never reads past the
        # header's frame count, so a header that under-states the length only shortens it.
        mono = np.empty(frames, dtype=np.float32)
        block = max(1024, _BLOCK_SAMPLES // channels)
        decoded = 0
        try:
            while chunk := len(samples := source.read(block, dtype="float32", always_2d=True)):
                if decoded + chunk > frames:  # cannot happen with soundfile; never grow
                    raise invalid_audio("audio holds more samples than its header says", param)
                np.mean(samples, axis=1, dtype=np.float32, out=mono[decoded : decoded + chunk])
                decoded += chunk
                if chunk < block:
                    break
        except OmniError:
            raise
        except Exception as exc:
            raise _decode_failed(exc, param) from exc
    if decoded == 0:
        raise invalid_audio("audio has no samples", param)
    mono = mono[:decoded]
    if not np.isfinite(mono).all():
        raise invalid_audio("audio contains NaN or infinite samples", param)
    return resample(mono, rate, target_rate)


async def decode_audio_async(
    data: bytes,
    *,
    max_seconds: float,
    param: str | None = "file",
    target_rate: int = AUDIO_INPUT_RATE,
    max_decoded_bytes: int | None = None,
    container: str | None = None,
) -> np.ndarray:
    """``decode_audio`` on the decode threads, so the event loop (and with it the heartbeat
    and every other request) keeps running while a long upload decodes. Use this from routes
    and the realtime API."""
    limit = DECODED_BYTES_LIMIT.get() if max_decoded_bytes is None else max_decoded_bytes
    work = functools.partial(
        decode_audio,
        data,
        max_seconds=max_seconds,
        param=param,
        target_rate=target_rate,
        max_decoded_bytes=limit,
        container=container,
    )
    return await asyncio.get_running_loop().run_in_executor(_decoder.pool, work)


def to_pcm16(samples: np.ndarray) -> bytes:
    """float32 in [-1, 1] -> little-endian int16 bytes (clipped)."""
    return (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def from_pcm16(pcm16: bytes) -> np.ndarray:
    return np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32767.0


class _Decoder:
    """The bounded thread pool that decodes and resamples uploads: a few threads, so a burst
    of uploads queues instead of taking every core (libsndfile and numpy release the GIL)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="audio-decode")

    def resize(self, threads: int) -> None:
        if threads != self.threads:
            old, self.threads = self.pool, threads
            self.pool = ThreadPoolExecutor(threads, thread_name_prefix="audio-decode")
            old.shutdown(wait=False)


_decoder = _Decoder(DEFAULT_DECODE_THREADS)


def configure_decoding(threads: int) -> None:
    """Size the decode pool (the worker's ``audio_decode_threads``)."""
    _decoder.resize(threads)


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
