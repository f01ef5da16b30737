"""Streaming a codec vocoder so that its audio equals the reference's whole-utterance decode.

Both Qwen3 vocoders (Qwen3-Omni's code2wav, Qwen3-TTS's speech-tokenizer decoder) are decoded
by their references in blocks (``chunked_decode``: ``block`` frames at a time, each decoded in
one pass with up to ``context`` frames before it, none before the first), and their decoders
are causal but see far back (stacked sliding-window attention: hundreds of frames). A stream
cut into small chunks with a short left context therefore drifts from the reference within a
few seconds (SNR 0.1 dB over 32 s of Qwen3-TTS, -2.3 dB over 2,047 Omni frames).

So a stream is decoded in the reference's blocks, and streams *within* a block: each step
decodes the block's window from its start up to the frames that have arrived, and sends the
samples not sent yet. The decoder is causal, so a window's prefix decodes to the prefix of
the window's decode, except for the ``lag`` samples that every decode leaves short at its end
(its transposed convolutions): those are sent by the next step, or never, as in the reference.
Steps ramp from ``first`` frames (a fast first packet) doubling up to ``chunk``, and restart at
every block. The cost is a re-decode of the block's start each step (a window of at most
``block + context`` frames); the bytes never depend on timing or load.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Blocks:
    block: int  # frames per reference block
    context: int  # frames decoded before each block but the first
    first: int  # frames of a block's first step
    chunk: int  # the largest step
    upsample: int  # samples per frame
    lag: int = 0  # samples every decode leaves short at its end

    def block_start(self, frame: int) -> int:
        return frame // self.block * self.block

    def window_start(self, start: int) -> int:
        """The reference's window for the block at ``start``: up to ``context`` frames earlier."""
        return start - (self.context if start - self.context > 0 else start)

    def sample_at(self, frame: int) -> int:
        """Where ``frame``'s audio starts in the reference's output (each block ``lag`` short)."""
        start = self.block_start(frame)
        return frame * self.upsample - (start // self.block) * self.lag


@dataclass(slots=True)
class BlockStream:
    """One utterance's progress: ``done`` frames are decoded, ``sent`` samples of the
    reference's output are out (a cloned voice's reference frames start both past zero)."""

    blocks: Blocks
    done: int = 0
    sent: int = 0
    step: int = 0  # the next step's size; 0: a block's first step

    @classmethod
    def after(cls, blocks: Blocks, frames: int) -> BlockStream:
        """A stream whose first ``frames`` (context codes) are decoded with it, never sent."""
        return cls(blocks, frames, blocks.sample_at(frames))

    def job(self, available: int, ended: bool) -> Job | None:
        """The next decode, once its frames have arrived (or the stream ended)."""
        b = self.blocks
        start = b.block_start(self.done)
        size = self.step or b.first
        end = min(self.done + size, start + b.block)
        if end > available:
            if not ended:
                return None
            end = available
        if end <= self.done:
            return None
        window = b.window_start(start)
        # the block's samples sit at (start - window) * upsample in the window's decode
        base = b.sample_at(start) - (start - window) * b.upsample
        high = b.sample_at(start) + (end - start) * b.upsample - b.lag
        return Job(window, end, self.sent - base, high - base, end, high)

    def advance(self, job: Job) -> None:
        b = self.blocks
        self.done, self.sent = job.next_done, job.next_sent
        crossed = b.block_start(self.done) != b.block_start(self.done - 1)
        self.step = 0 if crossed else min(2 * (self.step or b.first), b.chunk)


@dataclass(frozen=True, slots=True)
class Job:
    """Decode frames ``[window, end)`` and send samples ``[keep_from, keep_to)`` of it."""

    window: int
    end: int
    keep_from: int
    keep_to: int
    next_done: int
    next_sent: int
