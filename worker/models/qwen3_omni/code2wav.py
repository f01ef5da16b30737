"""Qwen3-Omni's code2wav: streamed codec frames (all code groups) -> 24 kHz int16 chunks.

Frames are cut at fixed boundaries (a short first chunk for a fast first packet, then
``chunk_frames``); each chunk is decoded together with up to ``left_context_frames`` frames
before it, and the context's samples are dropped, as ``Qwen3OmniMoeCode2Wav.chunked_decode``
does. The decoder is causal: with a left context that covers its receptive field the chunks
join into exactly the one-pass decode. Its transposed convolutions leave each decode ``lag``
samples short at the end, so every chunk after the first starts ``lag`` samples early.
Boundaries never depend on timing, so the bytes are the same under any load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from worker.models.qwen3_omni.common import load
from worker.stages.base import DONE, OUT, BatchQueue, Output, RequestMeta, StageExecutor


@dataclass(slots=True)
class _Stream:
    frames: list[np.ndarray] = field(default_factory=list)  # (groups,) each
    cut: int = 0  # frames already queued for decoding
    ended: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    queued: int = 0


class Code2WavExecutor(StageExecutor):
    def load(self) -> None:
        import torch

        self.torch = torch
        self.config, self.model = load(self.ctx)
        self.upsample = int(self.model.total_upsample)
        s = self.ctx.stage.streaming
        self.first_chunk, self.chunk, self.context = (
            s.first_chunk_frames,
            s.chunk_frames,
            s.left_context_frames,
        )
        b = self.ctx.stage.batching
        self.queue = BatchQueue(b.max_batch_size, b.window_ms)
        self.streams: dict[str, _Stream] = {}
        self.lag = 0

    def warmup(self) -> None:
        groups = self.model.config.num_quantizers
        frames = np.zeros((self.context + self.chunk, groups), np.int64)
        wav = self._decode([frames])[0]
        self.lag = len(frames) * self.upsample - wav.shape[-1]

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        self.streams.setdefault(rid, _Stream())

    def feed(self, rid: str, src: str, data: Any) -> None:
        s = self.streams.get(rid)
        if s is not None:
            s.frames.extend(np.asarray(data["codes"], dtype=np.int64))
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
            end = s.cut + (self.first_chunk if s.cut == 0 else self.chunk)
            if end > len(s.frames):
                if not s.ended or s.cut >= len(s.frames):
                    return
                end = len(s.frames)
            self.queue.put(rid, (s.cut, end))
            s.queued += 1
            s.cut = end

    def step(self) -> list[Output]:
        outs: list[Output] = []
        batch = [(rid, span) for rid, span in self.queue.take() if rid in self.streams]
        if batch:
            windows = []
            for rid, (a, b) in batch:
                frames = self.streams[rid].frames
                windows.append(np.stack(frames[max(0, a - self.context) : b]))
            for (rid, (a, _end)), wav in zip(batch, self._decode(windows), strict=True):
                ctx = a - max(0, a - self.context)
                start = ctx * self.upsample - (self.lag if a > 0 else 0)
                pcm = np.clip(np.round(wav[start:] * 32767.0), -32768, 32767).astype("<i2")
                outs.append((OUT, rid, ("audio", pcm)))
                self.streams[rid].queued -= 1
        for rid, s in list(self.streams.items()):
            if s.ended and s.queued == 0 and s.cut >= len(s.frames):
                del self.streams[rid]
                outs.append((DONE, rid, s.info))
        return outs

    def _decode(self, windows: list[np.ndarray]) -> list[np.ndarray]:
        """Windows of equal length decode as one batch; others one by one."""
        torch = self.torch
        out: list[np.ndarray] = [np.empty(0)] * len(windows)
        by_len: dict[int, list[int]] = {}
        for i, w in enumerate(windows):
            by_len.setdefault(len(w), []).append(i)
        with torch.inference_mode():
            for idx in by_len.values():
                codes = torch.from_numpy(np.stack([windows[i].T for i in idx])).to(self.ctx.device)
                wav = self.model(codes).float().cpu().numpy()[:, 0]
                for j, i in enumerate(idx):
                    out[i] = wav[j]
        return out
