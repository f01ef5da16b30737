"""Vocoder (code2wav): streamed codec frames -> 24 kHz int16 audio chunks.

Frames are cut at fixed boundaries (a short first chunk for a fast first packet, then
``CHUNK_FRAMES``), each decoded in a window of ``LEFT_CONTEXT`` earlier frames (zero codes
before the start), so every window has the same shape and chunks of several requests batch
together; the boundaries never depend on timing, so the audio bytes are deterministic.
The decoder is causal: a window's output is left-aligned; where it is ``lag`` samples short at
its end (Qwen3-Omni code2wav), each chunk starts ``lag`` samples early to stay gapless. The
talker predicts the first codebook; a codec with more codebooks gets that code repeated (tiny
models have no code predictor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from worker.models import codec
from worker.stages.base import (
    DONE,
    OUT,
    BatchQueue,
    Output,
    RequestMeta,
    StageExecutor,
    load_model,
)

FIRST_CHUNK_FRAMES = 4
CHUNK_FRAMES = 10
LEFT_CONTEXT = 4


@dataclass(slots=True)
class _Stream:
    codes: list[int] = field(default_factory=list)
    cut: int = 0  # frames already queued for decoding
    ended: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    queued: int = 0  # windows in the batch queue


class VocoderExecutor(StageExecutor):
    def load(self) -> None:
        import torch

        self.torch = torch
        self.model = load_model(self.ctx)
        self.upsample = codec.samples_per_frame(self.model)
        self.quantizers = codec.num_quantizers(self.model)
        self.window = LEFT_CONTEXT + CHUNK_FRAMES
        b = self.ctx.stage.batching
        self.queue = BatchQueue(b.max_batch_size, b.window_ms)
        self.streams: dict[str, _Stream] = {}

    def warmup(self) -> None:
        self._run(np.zeros((1, self.window), dtype=np.int64))

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        self.streams.setdefault(rid, _Stream())

    def feed(self, rid: str, src: str, data: Any) -> None:
        s = self.streams.get(rid)
        if s is not None:
            s.codes.extend(data["codes"])
            self._cut(rid, s)

    def end_stream(self, rid: str, src: str, info: dict[str, Any]) -> None:
        s = self.streams.get(rid)
        if s is not None:
            s.ended, s.info = True, dict(info)
            self._cut(rid, s)

    def abort(self, rid: str) -> None:
        self.streams.pop(rid, None)
        self.queue.drop(rid)

    def next_deadline(self) -> float | None:
        if any(s.ended and not s.queued for s in self.streams.values()):
            return 0.0
        return self.queue.deadline()

    def queue_depth(self) -> int:
        return len(self.streams)

    def _cut(self, rid: str, s: _Stream) -> None:
        while True:
            size = FIRST_CHUNK_FRAMES if s.cut == 0 else CHUNK_FRAMES
            end = s.cut + size
            if end > len(s.codes):
                if not s.ended or s.cut >= len(s.codes):
                    return
                end = len(s.codes)
            self.queue.put(rid, (s.cut, end))
            s.queued += 1
            s.cut = end

    def step(self) -> list[Output]:
        outs: list[Output] = []
        batch = [(rid, span) for rid, span in self.queue.take() if rid in self.streams]
        if batch:
            windows = np.zeros((len(batch), self.window), dtype=np.int64)
            for i, (rid, (_, b)) in enumerate(batch):
                codes = self.streams[rid].codes[max(0, b - self.window) : b]
                windows[i, self.window - len(codes) :] = codes
            wav = self._run(windows)
            lag = self.window * self.upsample - wav.shape[-1]
            for i, (rid, (a, b)) in enumerate(batch):
                start = (self.window - (b - a)) * self.upsample - (lag if a > 0 else 0)
                pcm = np.clip(np.round(wav[i, start:] * 32767.0), -32768, 32767).astype("<i2")
                outs.append((OUT, rid, ("audio", pcm)))
                self.streams[rid].queued -= 1
        for rid, s in list(self.streams.items()):
            if s.ended and s.queued == 0 and s.cut >= len(s.codes):
                del self.streams[rid]
                outs.append((DONE, rid, s.info))
        return outs

    def _run(self, windows: np.ndarray) -> np.ndarray:
        torch = self.torch
        codes = torch.from_numpy(windows).to(self.ctx.device)[:, None, :]
        codes = codes.expand(-1, self.quantizers, -1)
        with torch.inference_mode():
            return codec.decode(self.model, codes).float().cpu().numpy()
