"""Real speech for the turn-detection tests: English synthesized by espeak-ng (Debian's
``espeak-ng``; ``scripts/install.sh --dev`` installs it), at the realtime API's 24 kHz, with
where its speech starts and ends."""

from __future__ import annotations

import functools
import io
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import numpy as np
import soundfile as sf

from worker.layers.resample import resample

RATE = 24_000
# one breath, no punctuation: espeak pauses at commas and full stops, and the tests place their
# pauses themselves
WORDS = (
    "the quick brown fox jumps over the lazy dog and then it runs back home across the wide "
    "green field before the sun goes down behind the hills where the river bends toward the "
    "old stone bridge near the village"
)

# what a voice assistant hears: short requests, each one breath (the turn-detection set)
SENTENCES = [
    "please book a table for two at seven tonight",
    "what is the weather going to be like tomorrow morning",
    "turn off the lights in the kitchen and the living room",
    "i would like to change my flight to next tuesday",
    "can you read me the last message from my sister",
    "remind me to call the dentist after lunch",
    "how long does it take to drive to the airport",
    "play something quiet while i finish this report",
    "the meeting moved to the small room on the third floor",
    "send the invoice to the accounting team before friday",
    "add milk eggs and bread to the shopping list",
    "what time does the pharmacy close on sundays",
]


@functools.cache
def spoken(text: str, voice: str = "en-us", speed: int = 175) -> np.ndarray:
    """``text`` as espeak-ng says it (SSML: ``<break time="800ms"/>`` is a pause inside it):
    float32 mono at 24 kHz, cut to its speech (what is quieter than -40 dBFS at either end is
    silence espeak adds)."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        raise RuntimeError("espeak-ng is not installed (scripts/install.sh --dev installs it)")
    wav = subprocess.run(
        [espeak, "--stdout", "-m", "-v", voice, "-s", str(speed), text],
        check=True,
        capture_output=True,
    ).stdout
    samples, rate = sf.read(io.BytesIO(wav), dtype="float32")
    samples = resample(samples, rate, RATE)
    loud = np.flatnonzero(np.abs(samples) > 0.01)
    return samples[loud[0] : loud[-1] + 1]


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def speech_pcm(seconds: float, seed: int = 0) -> bytes:
    """``seconds`` of continuous speech (PCM16 at 24 kHz), starting at word ``seed`` of a long
    sentence and cut where the time is up."""
    words = WORDS.split()
    text = " ".join(words[seed % len(words) :] + words[: seed % len(words)])
    samples = spoken(text)
    n = int(seconds * RATE)
    if samples.size < n:
        raise ValueError(f"the sentence lasts {samples.size / RATE:.1f} s, not {seconds} s")
    return pcm16(samples[:n])


def pcm_frames(pcm: bytes, ms: int, make: Callable[[bytes], Any]) -> list:
    """24 kHz pcm16 in frames of ``ms`` milliseconds, each made by ``make`` (a framework's
    audio frame), as a microphone delivers them."""
    step = 24_000 * ms // 1000 * 2
    return [make(pcm[at : at + step]) for at in range(0, len(pcm), step)]
