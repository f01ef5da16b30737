"""Speech output beyond raw pcm16/wav: mp3, flac, opus and aac encoded by FFmpeg's encoders
(PyAV), whole or incrementally while the audio streams, and ``speed`` as FFmpeg's ``atempo``
filter (tempo changes, pitch stays).

The model speaks 24 kHz mono int16. Each encoder here is fed pcm16 chunks as they come and
returns whatever encoded bytes the container has written so far, so a streamed mp3 or opus
response starts with the first audio chunk like a streamed pcm one does.
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

from worker.engine import AUDIO_OUTPUT_RATE

# response_format -> (container, codec, sample rate, media type)
ENCODED = {
    "mp3": ("mp3", "libmp3lame", AUDIO_OUTPUT_RATE, "audio/mpeg"),
    "flac": ("flac", "flac", AUDIO_OUTPUT_RATE, "audio/flac"),
    "opus": ("ogg", "libopus", 48_000, "audio/ogg"),  # libopus takes 48 kHz in Ogg
    "aac": ("adts", "aac", AUDIO_OUTPUT_RATE, "audio/aac"),
}
FORMATS = ("wav", "pcm", *ENCODED)
MIN_SPEED, MAX_SPEED = 0.25, 4.0


def media_type(fmt: str) -> str:
    if fmt in ENCODED:
        return ENCODED[fmt][3]
    return "audio/wav" if fmt == "wav" else "audio/pcm"


class _Sink(io.RawIOBase):
    """A write-only file that hands out what was written since the last ``take``."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.buf += b
        return len(b)

    def take(self) -> bytes:
        out, self.buf = bytes(self.buf), bytearray()
        return out


class StreamEncoder:
    """pcm16 chunks in, encoded container bytes out (``feed`` per chunk, ``close`` at the end)."""

    def __init__(self, fmt: str, rate: int = AUDIO_OUTPUT_RATE) -> None:
        import av

        container, codec, out_rate, _ = ENCODED[fmt]
        self.sink = _Sink()
        # Ogg would hold pages back for a second: short pages so a streamed opus flows.
        options = {"page_duration": "20000"} if container == "ogg" else {}
        self.out = av.open(self.sink, "w", format=container, options=options)
        stream = self.out.add_stream(codec, rate=out_rate, layout="mono")
        # add_stream is annotated for any codec name; every codec in ENCODED is an audio one
        assert isinstance(stream, av.AudioStream)
        self.stream = stream
        self.rate = rate
        self.resampler = av.AudioResampler(format="s16", layout="mono", rate=out_rate)
        self.pts = 0

    def _encode(self, frame) -> None:
        for packet in self.stream.encode(frame):
            self.out.mux(packet)

    def feed(self, pcm16: bytes) -> bytes:
        import av

        if pcm16:
            samples = np.frombuffer(pcm16, dtype="<i2").reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
            frame.sample_rate = self.rate
            frame.pts = self.pts
            frame.time_base = Fraction(1, self.rate)
            self.pts += samples.shape[1]
            for f in self.resampler.resample(frame):
                self._encode(f)
        return self.sink.take()

    def close(self) -> bytes:
        for f in self.resampler.resample(None):
            self._encode(f)
        self._encode(None)
        self.out.close()
        return self.sink.take()


def encode_whole(pcm16: bytes, fmt: str) -> bytes:
    enc = StreamEncoder(fmt)
    return enc.feed(pcm16) + enc.close()


class Tempo:
    """``speed`` as FFmpeg's atempo (0.5..2 per filter; chained for 0.25 and 4)."""

    def __init__(self, speed: float, rate: int = AUDIO_OUTPUT_RATE) -> None:
        import av

        self.rate = rate
        self.graph = av.filter.Graph()
        src = self.graph.add_abuffer(
            format="s16", sample_rate=rate, layout="mono", time_base=Fraction(1, rate)
        )
        node = src
        for factor in _tempo_factors(speed):
            f = self.graph.add("atempo", f"{factor:.6f}")
            node.link_to(f)
            node = f
        sink = self.graph.add("abuffersink")
        node.link_to(sink)
        self.graph.configure()
        self.pts = 0

    def _drain(self) -> bytes:
        import av

        out = bytearray()
        while True:
            try:
                frame = self.graph.pull()
            except (av.error.BlockingIOError, av.error.EOFError):
                break
            out += frame.to_ndarray().astype("<i2").tobytes()
        return bytes(out)

    def feed(self, pcm16: bytes) -> bytes:
        import av

        if not pcm16:
            return b""
        samples = np.frombuffer(pcm16, dtype="<i2").reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = self.rate
        frame.pts = self.pts
        frame.time_base = Fraction(1, self.rate)
        self.pts += samples.shape[1]
        self.graph.push(frame)
        return self._drain()

    def close(self) -> bytes:
        self.graph.push(None)
        return self._drain()


def _tempo_factors(speed: float) -> list[float]:
    factors = []
    while speed < 0.5:
        factors.append(0.5)
        speed /= 0.5
    while speed > 2.0:
        factors.append(2.0)
        speed /= 2.0
    factors.append(speed)
    return factors


class Output:
    """The chain a response's pcm16 goes through: tempo (speed != 1), then the encoder."""

    def __init__(self, fmt: str, speed: float) -> None:
        self.tempo = Tempo(speed) if abs(speed - 1.0) > 1e-9 else None
        self.encoder = StreamEncoder(fmt) if fmt in ENCODED else None

    def feed(self, pcm16: bytes) -> bytes:
        if self.tempo is not None:
            pcm16 = self.tempo.feed(pcm16)
        return self.encoder.feed(pcm16) if self.encoder is not None else pcm16

    def close(self) -> bytes:
        tail = self.tempo.close() if self.tempo is not None else b""
        if self.encoder is not None:
            return self.encoder.feed(tail) + self.encoder.close()
        return tail
