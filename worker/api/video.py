"""Video inputs of chat requests: ``video_url`` parts (the convention of vLLM and SGLang) with
``data:video/...`` URLs, decoded with PyAV and sampled to frames at a fixed rate.

Limits are checked from the container's header before frames are decoded (duration, frame
size), and decoding stops at the frame cap, so a small file cannot expand without bound.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass

import numpy as np

from fleet.errors import ErrorCode, OmniError

FPS = 2.0  # frames sampled per second of video, as Qwen's video processing does by default
MAX_SECONDS = 60.0
MAX_FRAMES = 64
MAX_FRAME_PIXELS = 1920 * 1080
MAX_BYTES = 50 * 1024 * 1024


@dataclass(frozen=True)
class Video:
    frames: np.ndarray  # (T, H, W, 3) uint8
    fps: float  # the sampling rate of ``frames``


def _bad(message: str, param: str) -> OmniError:
    return OmniError(400, ErrorCode.INVALID_REQUEST, message, param)


def decode_video_url(url: str, param: str) -> Video:
    if url.startswith(("http://", "https://")):
        raise _bad("remote video URLs are not fetched by this worker; send a data: URL", param)
    head, sep, data = url.partition(",")
    if not sep or not head.startswith("data:video/") or not head.endswith(";base64"):
        raise _bad("video_url must be a data:video/<type>;base64,<data> URL", param)
    if len(data) > MAX_BYTES * 4 // 3 + 4:
        raise _bad(f"video larger than {MAX_BYTES // (1024 * 1024)} MB", param)
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise _bad("video_url data is not valid base64", param) from None
    return decode_video(raw, param)


def decode_video(raw: bytes, param: str) -> Video:
    import av

    try:
        container = av.open(io.BytesIO(raw))
    except (av.error.FFmpegError, ValueError, OSError):
        raise _bad("video cannot be decoded", param) from None
    with container:
        streams = container.streams.video
        if not streams:
            raise _bad("the file has no video stream", param)
        stream = streams[0]
        ctx = stream.codec_context
        if (ctx.width or 0) * (ctx.height or 0) > MAX_FRAME_PIXELS:
            raise _bad(
                f"video frames of {ctx.width}x{ctx.height} exceed {MAX_FRAME_PIXELS} pixels", param
            )
        duration = _duration(container, stream)
        if duration is not None and duration > MAX_SECONDS:
            raise _bad(f"video of {duration:.1f} s exceeds {MAX_SECONDS:.0f} s", param)
        frames: list[np.ndarray] = []
        next_at = 0.0
        try:
            for frame in container.decode(stream):
                t = float(frame.time) if frame.time is not None else len(frames) / FPS
                if t > MAX_SECONDS:
                    raise _bad(f"video longer than {MAX_SECONDS:.0f} s", param)
                if t + 1e-6 < next_at:
                    continue
                frames.append(frame.to_ndarray(format="rgb24"))
                next_at += 1.0 / FPS
                if len(frames) >= MAX_FRAMES:
                    break
        except av.error.FFmpegError:
            raise _bad("video cannot be decoded", param) from None
    if not frames:
        raise _bad("the video has no frames", param)
    return Video(np.stack(frames), FPS)


def _duration(container, stream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000
    return None
