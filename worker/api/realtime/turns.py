"""Server-side turn detection: Silero VAD (the ``silero-vad`` package's ONNX model, run by
onnxruntime) on 32 ms frames, with OpenAI's knobs on its speech probabilities; under
``semantic_vad``, Pipecat's Smart Turn v3 model (the ``pipecat-ai`` package's ONNX file, on
the package's own Whisper features) on each pause.

A frame is 512 samples at 16 kHz (768 of the session's 24 kHz audio), the size the model is
trained on; as the package's own ``OnnxWrapper`` does, each frame goes in with the last 64
samples before it, and the model's recurrent state carries from frame to frame. The decisions
are the package's ``VADIterator``'s: speech starts on the first frame whose probability reaches
``threshold``; it stops once the probability has stayed under ``threshold - 0.15`` for
``silence_duration_ms`` (in between, the turn neither ends nor restarts its count);
``prefix_padding_ms`` of audio before the start joins the committed turn.

``semantic_vad`` starts turns the same way. When a pause inside a turn reaches ``PAUSE_MS``, Smart
Turn reads the turn's last 8 s of audio (its pause included) and scores whether the speaker is
done; the session's ``eagerness`` (``config.EAGERNESS``) says how sure it must be, how much
silence then ends the turn, and how much ends it anyway (as SGLang-Omni's realtime server does,
``serve/realtime/semantic_vad.py``). A mid-sentence pause waits; a finished sentence does not.

The Silero model runs once for the frames of every session of a worker that arrived in one turn of
the event loop (``FrameBatcher``): one call of batch N costs far less than N calls
(docs/omni-worker.md, "Turn detection": measured per frame and per session).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import threading
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np

from worker.api import audio
from worker.api.realtime.config import EAGERNESS, PCM_RATE, VadConfig

MODEL_RATE = 16_000
MODEL_FRAME = 512  # samples at 16 kHz: 32 ms
CONTEXT = 64  # samples of the frame before that go in with each frame (the package's wrapper)
FRAME_SAMPLES = PCM_RATE * MODEL_FRAME // MODEL_RATE  # 768 at 24 kHz
HYSTERESIS = 0.15  # below threshold - this, a frame counts as silence (VADIterator's)
PAUSE_MS = 160  # semantic_vad: a pause this long is scored
TURN_SECONDS = 8  # what Smart Turn reads: the turn's last 8 s (its input's length)


def packaged(distribution: str, path: str) -> str:
    """A file a registry package ships, found without importing the package (``silero_vad``
    imports torch; ``pipecat`` logs on import)."""
    found = Path(str(metadata.distribution(distribution).locate_file(path)))
    if not found.is_file():
        raise FileNotFoundError(f"{distribution} has no {path}")
    return str(found)


def _onnx(path: str):  # -> onnxruntime.InferenceSession
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])


@dataclass(slots=True)
class SpeechStarted:
    at: int  # absolute sample position of the first voiced frame


@dataclass(slots=True)
class SpeechStopped:
    at: int  # just past the last voiced frame
    until: int  # just past the silence that ended the turn


@dataclass(slots=True)
class ModelState:
    """One audio stream's state in the model: its recurrent state and the end of its last
    frame."""

    state: np.ndarray = field(default_factory=lambda: np.zeros((2, 1, 128), np.float32))
    context: np.ndarray = field(default_factory=lambda: np.zeros(CONTEXT, np.float32))


class SileroVad:
    """The ONNX model in one onnxruntime session on one thread (a worker's realtime sessions
    share it)."""

    def __init__(self) -> None:
        self.session = _onnx(packaged("silero-vad", "silero_vad/data/silero_vad.onnx"))
        self._rate = np.array(MODEL_RATE, dtype=np.int64)

    def step(self, streams: list[ModelState], frames: np.ndarray) -> np.ndarray:
        """One frame (512 samples at 16 kHz) of each stream, in one call -> each one's speech
        probability; the streams' states advance."""
        x = np.concatenate([np.stack([s.context for s in streams]), frames], axis=1)
        state = np.concatenate([s.state for s in streams], axis=1)
        probs, state = self.session.run(None, {"input": x, "state": state, "sr": self._rate})
        for i, s in enumerate(streams):
            s.state = state[:, i : i + 1]
            s.context = frames[i, -CONTEXT:]
        return probs[:, 0]

    def probabilities(self, stream: ModelState, frames: np.ndarray) -> np.ndarray:
        """A stream's frames ``(n, 512)`` in order, one call each."""
        return np.array([self.step([stream], f[None])[0] for f in frames], dtype=np.float32)


@functools.cache
def silero() -> SileroVad:
    """The process's model, loaded on first use (~0.1 s)."""
    return SileroVad()


class FrameBatcher:
    """The frames that the sessions of one event loop hand in during one turn of it, scored
    together: round r takes the r-th waiting frame of every stream (a stream's frames run in
    order: each one's state is the last one's)."""

    def __init__(self, model: SileroVad) -> None:
        self.model = model
        self.waiting: list[tuple[ModelState, np.ndarray, asyncio.Future[np.ndarray]]] = []

    async def score(self, stream: ModelState, frames: np.ndarray) -> np.ndarray:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[np.ndarray] = loop.create_future()
        if not self.waiting:
            loop.call_soon(self._run)
        self.waiting.append((stream, frames, done))
        return await done

    def _run(self) -> None:
        waiting, self.waiting = self.waiting, []
        probs = [np.empty(len(frames), np.float32) for _, frames, _ in waiting]
        try:
            for r in range(max(len(frames) for _, frames, _ in waiting)):
                rows = [i for i, (_, frames, _) in enumerate(waiting) if len(frames) > r]
                got = self.model.step(
                    [waiting[i][0] for i in rows], np.stack([waiting[i][1][r] for i in rows])
                )
                for i, p in zip(rows, got, strict=True):
                    probs[i][r] = p
        except Exception as exc:  # (each session's feed raises it: none waits forever)
            for _, _, done in waiting:
                if not done.done():
                    done.set_exception(exc)
            return
        for (_, _, done), p in zip(waiting, probs, strict=True):
            if not done.done():  # (its session went away meanwhile)
                done.set_result(p)


@functools.cache
def batcher(loop: asyncio.AbstractEventLoop) -> FrameBatcher:
    """The batcher of a loop's sessions (one per worker process in service)."""
    return FrameBatcher(silero())


class SmartTurn:
    """Smart Turn v3.2: the probability that a turn is complete, from its last 8 s of audio
    (16 kHz, zeros before a shorter one), as Pipecat's ``LocalSmartTurnAnalyzerV3`` feeds it:
    Whisper's log-mel features of 8 s (80 bins, the waveform normalised first), computed by
    the package's own numpy code: the model is sensitive to them (transformers' extractor, equal
    to 1.5e-5, moved a probability by 8e-4)."""

    def __init__(self) -> None:
        from pipecat.audio.turn.smart_turn._whisper_features import (
            compute_whisper_log_mel_features,
        )

        path = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
        self.session = _onnx(packaged("pipecat-ai", path))
        self.features = compute_whisper_log_mel_features

    def complete(self, samples: np.ndarray) -> float:
        n = TURN_SECONDS * MODEL_RATE
        x = np.pad(samples[-n:], (max(0, n - samples.size), 0))
        features = self.features(x.astype(np.float32), do_normalize=True)[None]
        (probability,) = self.session.run(None, {"input_features": features.astype(np.float32)})
        return float(np.asarray(probability).reshape(-1)[0])


_loading = threading.Lock()


def smart_turn() -> SmartTurn:
    """The process's model, loaded once (a semantic_vad session warms it in a thread while a
    pause may ask for it in another: loading is not safe to race)."""
    with _loading:
        return _smart_turn()


@functools.cache
def _smart_turn() -> SmartTurn:
    return SmartTurn()


class ServerVad:
    def __init__(self, config: VadConfig, position: int = 0) -> None:
        self.config = config
        self.stream = ModelState()
        self.silence_samples = config.silence_duration_ms * PCM_RATE // 1000
        self.position = position  # absolute sample position of the next frame
        self.pending = bytearray()  # the start of a frame not complete yet
        self.speaking = False
        self.silent_since: int | None = None  # where the probability last fell below the floor
        self.voiced_until = position  # the end of the last frame at the threshold or over
        # semantic_vad: the turn's audio (16 kHz frames), and Smart Turn's score of its pause
        self.eagerness = EAGERNESS[config.eagerness or "auto"] if config.eagerness else None
        self.heard: collections.deque[np.ndarray] = collections.deque(
            maxlen=TURN_SECONDS * MODEL_RATE // MODEL_FRAME
        )
        self.complete: float | None = None
        self.scores: list[tuple[int, float]] = []  # (where, score) of every pause scored

    @property
    def prefix_samples(self) -> int:
        return self.config.prefix_padding_ms * PCM_RATE // 1000

    @property
    def keep_samples(self) -> int:
        """Audio before the next frame that a turn starting there may still take."""
        return self.prefix_samples + FRAME_SAMPLES

    def reset(self, position: int) -> None:
        """The buffer was committed or cleared: the next audio starts a new turn."""
        self.position = position
        self.pending.clear()
        self._end()

    def _end(self) -> None:
        self.speaking = False
        self.silent_since = None
        self.heard.clear()
        self.complete = None

    def frames(self, pcm16: bytes) -> np.ndarray:
        """The whole frames now buffered, at the model's rate ``(n, 512)``; the rest waits."""
        self.pending += pcm16
        n = len(self.pending) // (2 * FRAME_SAMPLES)
        if not n:
            return np.zeros((0, MODEL_FRAME), np.float32)
        samples = audio.from_pcm16(bytes(self.pending[: n * 2 * FRAME_SAMPLES]))
        del self.pending[: n * 2 * FRAME_SAMPLES]
        per_frame = samples.reshape(n, FRAME_SAMPLES)
        return np.stack([audio.resample(f, PCM_RATE, MODEL_RATE) for f in per_frame])

    async def feed(self, pcm16: bytes) -> list[SpeechStarted | SpeechStopped]:
        """The turns that this audio starts and ends."""
        frames = self.frames(pcm16)
        if not len(frames):
            return []
        probs = await batcher(asyncio.get_running_loop()).score(self.stream, frames)
        found: list[SpeechStarted | SpeechStopped] = []
        for frame, p in zip(frames, probs, strict=True):
            turn = await self._frame(frame, float(p))
            if turn is not None:
                found.append(turn)
        return found

    async def _frame(self, frame: np.ndarray, p: float) -> SpeechStarted | SpeechStopped | None:
        start, self.position = self.position, self.position + FRAME_SAMPLES
        threshold = self.config.threshold
        if p >= threshold:
            self.silent_since = self.complete = None
            self.voiced_until = self.position
            self.heard.append(frame)
            if not self.speaking:
                self.speaking = True
                return SpeechStarted(start)
            return None
        if not self.speaking:
            return None
        self.heard.append(frame)
        if p >= threshold - HYSTERESIS:
            return None  # (neither speech nor silence: the count goes on where it was)
        if self.silent_since is None:
            self.silent_since = start
        silence = self.position - self.silent_since
        if self.eagerness and self.complete is None and silence >= PAUSE_MS * PCM_RATE // 1000:
            turn = np.concatenate(self.heard)  # (its model in a thread: the loop serves others)
            self.complete = await asyncio.to_thread(lambda: smart_turn().complete(turn))
            self.scores.append((self.position, self.complete))
        if silence >= self._wait():
            stopped = SpeechStopped(self.voiced_until, self.position)
            self._end()
            return stopped
        return None

    def _wait(self) -> int:
        """The silence that ends the turn now: ``silence_duration_ms``, or under semantic_vad
        less where Smart Turn scored this pause as the end of what the speaker had to say."""
        eager = self.eagerness
        if eager is not None and self.complete is not None and self.complete >= eager.complete:
            return min(self.silence_samples, eager.complete_ms * PCM_RATE // 1000)
        return self.silence_samples
