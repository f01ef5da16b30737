"""Server-side turn detection: WebRTC's voice activity detector (``webrtcvad-wheels``) on 30 ms
frames, with OpenAI's knobs. ``threshold`` (0..1) picks the detector's aggressiveness (0..3):
higher means less noise counts as speech. Speech starts after ``START_FRAMES`` voiced frames in
a row (a click is not a turn) and stops after ``silence_duration_ms`` of unvoiced frames;
``prefix_padding_ms`` of audio before the start joins the committed turn."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import webrtcvad

from worker.api import audio
from worker.api.realtime.config import PCM_RATE, VadConfig

FRAME_MS = 30
VAD_RATE = 16_000  # webrtcvad takes 8, 16, 32 or 48 kHz; 24 kHz frames are resampled
FRAME_SAMPLES = PCM_RATE * FRAME_MS // 1000  # 720 at 24 kHz -> 480 at 16 kHz, exactly
START_FRAMES = 3


@dataclass(slots=True)
class SpeechStarted:
    at: int  # absolute sample position of the first voiced frame


@dataclass(slots=True)
class SpeechStopped:
    at: int  # just past the last voiced frame
    until: int  # just past the silence that ended the turn


def aggressiveness(threshold: float) -> int:
    return min(3, int(threshold * 4))


class ServerVad:
    def __init__(self, config: VadConfig, position: int = 0) -> None:
        self.config = config
        self.vad = webrtcvad.Vad(aggressiveness(config.threshold))
        self.silence_frames = max(1, -(-config.silence_duration_ms // FRAME_MS))
        self.position = position  # absolute sample position of the next frame
        self.pending = bytearray()  # the start of a frame not complete yet
        self.speaking = False
        self.voiced_run = 0
        self.unvoiced_run = 0
        self.last_voiced_end = 0

    @property
    def prefix_samples(self) -> int:
        return self.config.prefix_padding_ms * PCM_RATE // 1000

    @property
    def keep_samples(self) -> int:
        """Audio before the next frame that a turn starting there may still take."""
        return self.prefix_samples + START_FRAMES * FRAME_SAMPLES

    def reset(self, position: int) -> None:
        """The buffer was committed or cleared: the next audio starts a new turn."""
        self.position = position
        self.pending.clear()
        self.speaking = False
        self.voiced_run = self.unvoiced_run = 0

    def _voiced(self, frame: bytes) -> bool:
        samples = audio.resample(audio.from_pcm16(frame), PCM_RATE, VAD_RATE)
        pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
        return self.vad.is_speech(pcm, VAD_RATE)

    def feed(self, pcm16: bytes) -> list[SpeechStarted | SpeechStopped]:
        self.pending += pcm16
        found: list[SpeechStarted | SpeechStopped] = []
        size = FRAME_SAMPLES * 2
        while len(self.pending) >= size:
            frame = bytes(self.pending[:size])
            del self.pending[:size]
            start, self.position = self.position, self.position + FRAME_SAMPLES
            if self._voiced(frame):
                self.voiced_run += 1
                self.unvoiced_run = 0
                self.last_voiced_end = self.position
                if not self.speaking and self.voiced_run >= START_FRAMES:
                    self.speaking = True
                    found.append(SpeechStarted(start - (START_FRAMES - 1) * FRAME_SAMPLES))
            else:
                self.voiced_run = 0
                self.unvoiced_run += 1
                if self.speaking and self.unvoiced_run >= self.silence_frames:
                    self.speaking = False
                    found.append(SpeechStopped(self.last_voiced_end, self.position))
        return found
