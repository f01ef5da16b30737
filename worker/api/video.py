"""Video inputs of chat requests: the bytes of a ``video_url`` part (the convention of vLLM and
SGLang; see :mod:`worker.api.media`), decoded with PyAV and sampled to frames at a fixed rate.

Limits are checked from the container's header before frames are decoded (duration, frame
size), and decoding stops at the frame cap, so a small file cannot expand without bound.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from worker.api.media import bad

FPS = 2.0  # frames sampled per second of video, as Qwen's video processing does by default
MAX_SECONDS = 60.0
MAX_FRAMES = 64
MAX_FRAME_PIXELS = 1920 * 1080


@dataclass(frozen=True)
class Video:
    frames: np.ndarray  # (T, H, W, 3) uint8
    fps: float  # the sampling rate of ``frames``


def decode_video(raw: bytes, param: str) -> Video:
    import av

    try:
        container = av.open(io.BytesIO(raw), mode="r")
    except (av.error.FFmpegError, ValueError, OSError):
        raise bad("video cannot be decoded", param) from None
    with container:
        streams = container.streams.video
        if not streams:
            raise bad("the file has no video stream", param)
        stream = streams[0]
        ctx = stream.codec_context
        if (ctx.width or 0) * (ctx.height or 0) > MAX_FRAME_PIXELS:
            raise bad(
                f"video frames of {ctx.width}x{ctx.height} exceed {MAX_FRAME_PIXELS} pixels", param
            )
        duration = _duration(container, stream)
        if duration is not None and duration > MAX_SECONDS:
            raise bad(f"video of {duration:.1f} s exceeds {MAX_SECONDS:.0f} s", param)
        frames: list[np.ndarray] = []
        next_at = 0.0
        try:
            for frame in container.decode(stream):
                t = float(frame.time) if frame.time is not None else len(frames) / FPS
                if t > MAX_SECONDS:
                    raise bad(f"video longer than {MAX_SECONDS:.0f} s", param)
                if t + 1e-6 < next_at:
                    continue
                frames.append(frame.to_ndarray(format="rgb24"))
                next_at += 1.0 / FPS
                if len(frames) >= MAX_FRAMES:
                    break
        except av.error.FFmpegError:
            raise bad("video cannot be decoded", param) from None
    if not frames:
        raise bad("the video has no frames", param)
    return Video(np.stack(frames), FPS)


def _duration(container, stream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000
    return None
