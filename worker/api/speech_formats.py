"""Speech output beyond raw 24 kHz pcm16/wav: mp3, flac, opus and aac encoded by FFmpeg's
encoders (PyAV), G.711 mu-law / A-law telephony audio (8 kHz, a byte per sample, no header),
``sample_rate`` by FFmpeg's resampler (libswresample), and ``speed`` as FFmpeg's ``atempo``
filter (tempo changes, pitch stays); whole or incrementally while the audio streams.

The model speaks 24 kHz mono int16. Each step of the chain here is fed pcm16 chunks as they
come and returns what it has made so far (the resampler and the encoders keep their state
between chunks), so a streamed mp3 or mu-law response starts with the first audio chunk like a
streamed pcm one does, and equals the whole response's bytes.
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import Protocol

import numpy as np

from fleet.errors import ErrorCode, OmniError
from worker.contract.pipeline import AUDIO_OUTPUT_RATE

# response_format -> (container, codec, default sample rate, media type)
ENCODED = {
    "mp3": ("mp3", "libmp3lame", AUDIO_OUTPUT_RATE, "audio/mpeg"),
    "flac": ("flac", "flac", AUDIO_OUTPUT_RATE, "audio/flac"),
    "opus": ("ogg", "libopus", 48_000, "audio/ogg"),  # an Ogg Opus stream plays at 48 kHz
    "aac": ("adts", "aac", AUDIO_OUTPUT_RATE, "audio/aac"),
}
# response_format -> (FFmpeg's codec, media type: RFC 4856's names, as realtime's audio/pcmu)
G711 = {"mulaw": ("pcm_mulaw", "audio/pcmu"), "alaw": ("pcm_alaw", "audio/pcma")}
G711_RATE = 8_000
OPUS_RATES = (8_000, 12_000, 16_000, 24_000, 48_000)  # the rates libopus encodes
FORMATS = ("wav", "pcm", *ENCODED, *G711)
MIN_SPEED, MAX_SPEED = 0.25, 4.0


def media_type(fmt: str) -> str:
    if fmt in ENCODED:
        return ENCODED[fmt][3]
    if fmt in G711:
        return G711[fmt][1]
    return "audio/wav" if fmt == "wav" else "audio/pcm"


def output_rate(fmt: str, sample_rate: int | None, param: str = "sample_rate") -> int:
    """The rate a response in ``fmt`` is sent at: ``sample_rate`` if the format can carry it
    (a 400 naming ``param`` if not), else the format's own."""
    if fmt in G711:
        if sample_rate not in (None, G711_RATE):
            raise OmniError(
                400, ErrorCode.INVALID_REQUEST,
                f"{fmt} is G.711 telephony audio, 8 kHz only: sample_rate must be 8000 or unset",
                param,
            )  # fmt: skip
        return G711_RATE
    if fmt == "opus" and sample_rate is not None and sample_rate not in OPUS_RATES:
        raise OmniError(
            400, ErrorCode.INVALID_REQUEST,
            f"opus encodes at {', '.join(map(str, OPUS_RATES))} Hz, not {sample_rate}", param,
        )  # fmt: skip
    if sample_rate is not None:
        return sample_rate
    return ENCODED[fmt][2] if fmt in ENCODED else AUDIO_OUTPUT_RATE


def _frame(pcm16: bytes, rate: int, pts: int):
    import av

    samples = np.frombuffer(pcm16, dtype="<i2").reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
    frame.sample_rate = rate
    frame.pts = pts
    frame.time_base = Fraction(1, rate)
    return frame


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

    def __init__(
        self, fmt: str, out_rate: int | None = None, rate: int = AUDIO_OUTPUT_RATE
    ) -> None:
        import av

        container, codec, default_rate, _ = ENCODED[fmt]
        out_rate = out_rate or default_rate
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
        if pcm16:
            frame = _frame(pcm16, self.rate, self.pts)
            self.pts += frame.samples
            for f in self.resampler.resample(frame):
                self._encode(f)
        return self.sink.take()

    def close(self) -> bytes:
        for f in self.resampler.resample(None):
            self._encode(f)
        self._encode(None)
        self.out.close()
        return self.sink.take()


class Resampler:
    """pcm16 at ``rate`` -> pcm16 at ``out_rate`` (libswresample, its filter state kept
    between chunks, so chunks resampled one by one equal the whole resampled at once)."""

    def __init__(self, out_rate: int, rate: int = AUDIO_OUTPUT_RATE) -> None:
        import av

        self.rate = rate
        self.resampler = av.AudioResampler(format="s16", layout="mono", rate=out_rate)
        self.pts = 0

    @staticmethod
    def _bytes(frames) -> bytes:
        return b"".join(f.to_ndarray().astype("<i2", copy=False).tobytes() for f in frames)

    def feed(self, pcm16: bytes) -> bytes:
        if not pcm16:
            return b""
        frame = _frame(pcm16, self.rate, self.pts)
        self.pts += frame.samples
        return self._bytes(self.resampler.resample(frame))

    def close(self) -> bytes:
        return self._bytes(self.resampler.resample(None))


class G711Encoder:
    """pcm16 at 8 kHz -> G.711 bytes (FFmpeg's pcm_mulaw / pcm_alaw: a byte per sample)."""

    def __init__(self, fmt: str) -> None:
        import av

        codec = av.CodecContext.create(G711[fmt][0], "w")
        assert isinstance(codec, av.AudioCodecContext)  # (pcm_mulaw / pcm_alaw: audio codecs)
        self.codec = codec
        self.codec.sample_rate = G711_RATE
        self.codec.format = "s16"
        self.codec.layout = "mono"
        self.codec.open()
        self.pts = 0

    def _encode(self, frame) -> bytes:
        return b"".join(bytes(p) for p in self.codec.encode(frame))

    def feed(self, pcm16: bytes) -> bytes:
        if not pcm16:
            return b""
        frame = _frame(pcm16, G711_RATE, self.pts)
        self.pts += frame.samples
        return self._encode(frame)

    def close(self) -> bytes:
        return self._encode(None)


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


class _Step(Protocol):
    def feed(self, data: bytes) -> bytes: ...
    def close(self) -> bytes: ...


class Output:
    """The chain a response's 24 kHz pcm16 goes through: tempo (``speed`` != 1), then the
    resampler (raw pcm at another rate, or G.711's 8 kHz), then the encoder (a container's
    encoder resamples on its own). wav and pcm come out as raw pcm16 at ``rate``."""

    def __init__(self, fmt: str, speed: float, rate: int = AUDIO_OUTPUT_RATE) -> None:
        steps: list[_Step] = []
        if abs(speed - 1.0) > 1e-9:
            steps.append(Tempo(speed))
        if fmt in ENCODED:
            steps.append(StreamEncoder(fmt, rate))
        else:
            if rate != AUDIO_OUTPUT_RATE:
                steps.append(Resampler(rate))
            if fmt in G711:
                steps.append(G711Encoder(fmt))
        self.steps = steps

    def feed(self, pcm16: bytes) -> bytes:
        data = pcm16
        for step in self.steps:
            data = step.feed(data)
        return data

    def close(self) -> bytes:
        """What every step still holds, each one's tail fed through the steps after it."""
        data = b""
        for step in self.steps:
            data = step.feed(data) + step.close()
        return data
