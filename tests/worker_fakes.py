"""A small deterministic Engine for testing the worker's HTTP layer in-process, before and
beside the real pipeline. Test-only: the daemon never uses it."""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections.abc import AsyncIterator

import numpy as np

from worker.contract.pipeline import (
    AUDIO_INPUT_RATE,
    AudioChunk,
    ClipStart,
    Event,
    Finished,
    GenerationRequest,
    PipelineStatus,
    ProgressCallback,
    RequestInvalid,
    RequestKind,
    StageFailed,
    StageLoad,
    TextDelta,
)

CHUNK_SAMPLES = 2400  # 0.1 s at 24 kHz


class FakePipeline:
    def __init__(self, *, step_s: float = 0.005) -> None:
        self.step_s = step_s
        self.ready = False
        self.healthy = True
        self.running: dict[str, GenerationRequest] = {}
        self.aborted: list[str] = []
        self.seen: list[GenerationRequest] = []
        self.hold = asyncio.Event()  # cleared: requests with "HOLD" in their text wait on it
        self.hold.set()
        # set: a transcription's text follows a ClipStart with these languages in turn, as
        # Qwen3-ASR writes the language it detected ("" when it writes none)
        self.detects: list[str] = []
        self.limits: dict[str, int] = {}  # the thinker's running + queued limit, when set

    async def start(self, progress: ProgressCallback) -> None:
        progress("fake: loading")
        self.ready = True

    async def stop(self) -> None:
        self.ready = False

    def speakers(self) -> list[str]:
        return ["tiny", "alloy"]

    def follows_instructions(self) -> bool:
        return False

    def designed_voice(self) -> str | None:
        return None

    def stage_limits(self, outputs: frozenset[str]) -> dict[str, int]:
        return self.limits

    def status(self) -> PipelineStatus:
        return PipelineStatus(
            ready=self.ready,
            healthy=self.healthy,
            stages={"thinker": StageLoad(queue_depth=len(self.running), busy=0.0)},
        )

    @staticmethod
    def reply_text(request: GenerationRequest) -> str:
        if request.kind == RequestKind.TRANSCRIPTION:
            assert request.audio is not None
            return f"heard {request.audio.size / AUDIO_INPUT_RATE:.2f} seconds"
        if request.kind == RequestKind.SPEECH:
            return request.text
        last = request.messages[-1]["content"] if request.messages else ""
        if isinstance(last, list):  # parts in order: its text, and audio clips in their turns
            last = "".join(p["text"] for p in last if p["type"] == "text")
        clips = [
            p["audio"]
            for m in request.messages
            if isinstance(m["content"], list)
            for p in m["content"]
            if p["type"] == "audio"
        ]
        extra = f" +{sum(c.size for c in clips)} samples" if clips else ""
        return f"echo {last}{extra}"

    @staticmethod
    def pcm_for(text: str, voice: str | None, chunk: int) -> bytes:
        seed = hashlib.sha256(f"{text}|{voice}|{chunk}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(seed[:8], "little"))
        samples = (rng.standard_normal(CHUNK_SAMPLES) * 3000).astype("<i2")
        return samples.tobytes()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Event]:
        self.seen.append(request)
        self.running[request.request_id] = request
        finished = False
        try:
            text = self.reply_text(request)
            if "FAIL" in text:
                raise StageFailed("fake stage 'thinker' died")
            if "REFUSE" in text:
                raise RequestInvalid("prompt is longer than the context (9999 > 2048 tokens)")
            if "HOLD" in text:
                await self.hold.wait()
            words = text.split(" ")
            if request.kind == RequestKind.TRANSCRIPTION and self.detects:
                assert request.audio is not None
                yield ClipStart(self.detects.pop(0), 0.0, request.audio.size / AUDIO_INPUT_RATE)
            if request.max_tokens is not None:
                words = words[: request.max_tokens]
            for i, word in enumerate(words):
                await asyncio.sleep(self.step_s)
                if request.kind != RequestKind.SPEECH:
                    yield TextDelta(word if i == 0 else " " + word)
            if request.output_audio:
                voice = request.voice
                if request.voice_audio is not None:
                    voice += struct.pack("<f", float(request.voice_audio.sum())).hex()
                # (LAG: chunks of 0.1 s of audio 0.3 s apart, slower than real time)
                gap = 0.3 if "LAG" in text else self.step_s
                for chunk in range(3):
                    await asyncio.sleep(gap)
                    yield AudioChunk(self.pcm_for(text, voice, chunk))
            yield Finished("stop", prompt_tokens=len(text), completion_tokens=len(words))
            finished = True
        finally:
            self.running.pop(request.request_id, None)
            if not finished:
                self.aborted.append(request.request_id)
