"""The vocoder stage: a codec vocoder decoded as its frames arrive
(``worker.layers.streamed_vocoder``: each layer keeps what it needs between steps, so that a
stream costs what its audio costs and equals the reference's decode at any length), its audio
sent as int16 chunks. Streams at the same point (equal step sizes, none at a block's start)
decode as one batch."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from worker.contract.pipeline import AUDIO_OUTPUT_RATE
from worker.layers.streamed_vocoder import Block, Schedule, StreamedDecoder
from worker.stages.base import DONE, FINAL, OUT, Output, RequestMeta, StageExecutor
from worker.stages.payloads import CodeFrames, SpokenAudio


@dataclass(slots=True)
class Stream:
    """One utterance's codes and where its decode stands: ``done`` frames decoded; ``unsent``
    samples at its start are decoded and never sent (a cloned voice's reference codes, which
    the reference decodes before the reply in one sequence)."""

    frames: list[Any] = field(default_factory=list)  # (groups,) each
    done: int = 0
    step: int = 0  # the next step's size; 0: the first
    unsent: int = 0
    ended: bool = False
    block: Block | None = None
    info: dict[str, Any] = field(default_factory=dict)
    heard: list[Any] | None = None  # every chunk sent, where an aligner times its words

    def ready(self, b: Schedule) -> int:
        """How many frames the next step decodes (0: none yet): a full step, never past the
        block's end, or what is left of an ended stream."""
        want = min(self.step or b.first, (self.done // b.block + 1) * b.block - self.done)
        available = len(self.frames) - self.done
        if available >= want:
            return want
        return available if self.ended else 0

    def finished(self) -> bool:
        return self.ended and self.done >= len(self.frames)


def _open(s: Stream) -> Block:
    if s.block is None:
        raise RuntimeError("a stream stepped before its block was opened")
    return s.block


class VocoderExecutor(StageExecutor):
    """The vocoder stage: every stream decoded as its codes come (``StreamedDecoder``), its
    audio sent as int16 chunks. A family's executor builds the decoder in ``load``
    (``self.decoder``) and may give a stream hidden leading frames (``hide``)."""

    decoder: StreamedDecoder

    def streaming_schedule(self, upsample: int) -> Schedule:
        s = self.ctx.stage.streaming
        return Schedule(s.block_frames, s.left_context_frames, s.first_chunk_frames,
                        s.chunk_frames, upsample)  # fmt: skip

    def init_streams(self) -> None:
        self.streams: dict[str, Stream] = {}
        self.ready_since: float | None = None  # when a stream had a step ready, unserved

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        s = self.streams.setdefault(rid, Stream())
        if "words" in meta.outputs:
            s.heard = []

    def feed(self, rid: str, src: str, data: Any) -> None:
        frames: CodeFrames = data
        if frames.context:
            self.hide(rid, frames.codes)
            return
        s = self.streams.get(rid)
        if s is not None:
            s.frames.extend(np.asarray(frames.codes, dtype=np.int64))

    def hide(self, rid: str, frames: Any) -> None:
        """Frames decoded before the stream's own, their audio never sent (a cloned voice's
        reference codes: the package decodes the reference and the reply in one sequence)."""
        s = self.streams.get(rid)
        if s is not None:
            if s.done:
                raise RuntimeError(f"{rid}: hidden frames after the stream started")
            hidden = list(np.asarray(frames, dtype=np.int64))
            s.frames[:0] = hidden
            s.unsent = len(hidden) * self.decoder.schedule.upsample

    def end_stream(self, rid: str, src: str, info: dict[str, Any]) -> None:
        s = self.streams.get(rid)
        if s is not None:
            s.ended, s.info = True, dict(info)

    def abort(self, rid: str) -> None:
        self.streams.pop(rid, None)

    def queue_depth(self) -> int:
        return len(self.streams)

    def next_deadline(self) -> float | None:
        b = self.decoder.schedule
        ready = sum(1 for s in self.streams.values() if s.ready(b))
        if any(s.finished() for s in self.streams.values()):
            return 0.0
        if not ready:
            self.ready_since = None
            return None
        now = time.monotonic()
        if self.ready_since is None:
            self.ready_since = now
        batching = self.ctx.stage.batching
        if ready >= batching.max_batch_size:
            return now
        return self.ready_since + batching.window_ms / 1000.0

    def step(self) -> list[Output]:
        """One step of every stream that has one ready. Streams with as many frames to decode,
        past their block's first step, decode together, up to ``batching.max_batch_size``
        (1: every stream alone, so the bytes never depend on what else runs: batched
        convolutions round differently)."""
        b = self.decoder.schedule
        self.ready_since = None
        outs: list[Output] = []
        groups: dict[int, list[tuple[str, Stream, int]]] = {}
        alone: list[list[tuple[str, Stream, int]]] = []
        for rid, s in self.streams.items():
            n = s.ready(b)
            if not n:
                continue
            if s.block is None or s.done == s.block.start + b.block:
                s.block = self.decoder.open(s.frames, s.done)
            if s.block.decoded:
                groups.setdefault(n, []).append((rid, s, n))
            else:
                alone.append([(rid, s, n)])
        cap = max(1, self.ctx.stage.batching.max_batch_size)
        batches = alone + [g[i : i + cap] for g in groups.values() for i in range(0, len(g), cap)]
        with torch.inference_mode():
            for batch in batches:
                work = [(_open(s), s.frames[s.done : s.done + n]) for _, s, n in batch]
                for (rid, s, n), wav in zip(batch, self.decoder.decode(work), strict=True):
                    s.done += n
                    s.step = min(2 * (s.step or b.first), b.chunk)
                    drop = min(s.unsent, wav.shape[0])
                    s.unsent -= drop
                    pcm = wav[drop:].float().cpu().numpy()
                    pcm = np.clip(np.round(pcm * 32767.0), -32768, 32767).astype("<i2")
                    outs.append((OUT, rid, ("audio", pcm)))
                    if s.heard is not None:
                        s.heard.append(pcm)
        for rid, s in list(self.streams.items()):
            if s.finished():
                del self.streams[rid]
                if s.heard is not None:
                    pcm = np.concatenate(s.heard) if s.heard else np.zeros(0, "<i2")
                    outs.append((FINAL, rid, SpokenAudio(pcm, AUDIO_OUTPUT_RATE)))
                outs.append((DONE, rid, s.info))
        return outs
