"""Qwen3-Omni's code2wav: streamed codec frames (all code groups) -> 24 kHz int16 chunks.

The stream is decoded in ``Qwen3OmniMoeCode2Wav.chunked_decode``'s blocks (``block_frames``, each
with ``left_context_frames`` before it) and streams within each block
(``worker.stages.vocoder_blocks``): the streamed waveform is transformers' decode of the same
codes, at any length. Steps never depend on timing, so the bytes are the same under any load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from worker.models.qwen3_omni.common import load
from worker.stages.base import DONE, OUT, BatchQueue, Output, RequestMeta, StageExecutor
from worker.stages.vocoder_blocks import Blocks, BlockStream, Job


@dataclass(slots=True)
class _Stream:
    progress: BlockStream
    frames: list[np.ndarray] = field(default_factory=list)  # (groups,) each
    ended: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    queued: int = 0


class Code2WavExecutor(StageExecutor):
    def load(self) -> None:
        import torch

        self.torch = torch
        self.config, self.model = load(self.ctx)
        self.upsample = int(self.model.total_upsample)
        b = self.ctx.stage.batching
        self.queue = BatchQueue(b.max_batch_size, b.window_ms)
        self.streams: dict[str, _Stream] = {}
        self.blocks = self._blocks(lag=0)

    def _blocks(self, lag: int) -> Blocks:
        s = self.ctx.stage.streaming
        return Blocks(
            s.block_frames, s.left_context_frames, s.first_chunk_frames, s.chunk_frames,
            self.upsample, lag,
        )  # fmt: skip

    def warmup(self) -> None:
        groups = self.model.config.num_quantizers
        frames = np.zeros((2 * self.ctx.stage.streaming.chunk_frames, groups), np.int64)
        wav = self._decode([frames])[0]
        self.blocks = self._blocks(lag=len(frames) * self.upsample - wav.shape[-1])

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        self.streams.setdefault(rid, _Stream(BlockStream(self.blocks)))

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
        """Queue every step whose frames have arrived (steps are planned ahead: each job
        records where the stream stands after it)."""
        while (job := s.progress.job(len(s.frames), s.ended)) is not None:
            self.queue.put(rid, job)
            s.queued += 1
            s.progress.advance(job)

    def step(self) -> list[Output]:
        outs: list[Output] = []
        batch: list[tuple[str, Job]] = [
            (rid, job) for rid, job in self.queue.take() if rid in self.streams
        ]
        if batch:
            windows = [
                np.stack(self.streams[rid].frames[job.window : job.end]) for rid, job in batch
            ]
            for (rid, job), wav in zip(batch, self._decode(windows), strict=True):
                part = wav[job.keep_from : job.keep_to]
                pcm = np.clip(np.round(part * 32767.0), -32768, 32767).astype("<i2")
                outs.append((OUT, rid, ("audio", pcm)))
                self.streams[rid].queued -= 1
        for rid, s in list(self.streams.items()):
            if s.ended and s.queued == 0 and s.progress.done >= len(s.frames):
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
