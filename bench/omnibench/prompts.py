"""What the benchmark sends: prompts of varied lengths (built in, or one per line of a JSONL
file) and speech-like clips to transcribe or to speak into a realtime session."""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

AUDIO_RATE = 24_000  # the API's PCM16 rate (speech output, realtime in and out)

# Sentences the built-in prompts are made of; a prompt is 1, 3 or 8 of them, so the set spans
# a short question, a paragraph and a page's worth of context.
_SENTENCES = (
    "Explain how a bicycle stays upright while it moves.",
    "The harbour was quiet that morning, and the fishing boats had not yet gone out.",
    "Summarise the main causes of the French Revolution in plain words.",
    "A good recipe lists its ingredients in the order they are used.",
    "Write a short reply to a customer whose parcel arrived two days late.",
    "Rivers carry sediment downstream and build deltas where they meet the sea.",
    "Translate the idea of a rainy Sunday afternoon into a haiku.",
    "The train to the coast leaves every hour from the second platform.",
    "Describe the difference between weather and climate to a ten-year-old.",
    "Old lighthouses were lit by oil lamps and turned by clockwork.",
)


@dataclass(frozen=True)
class Prompt:
    text: str
    max_tokens: int | None = None  # a JSONL line's own limit; else the run's --max-tokens


def builtin_prompts() -> list[Prompt]:
    """Twelve prompts: four each of 1, 3 and 8 sentences."""
    out = []
    for i in range(12):
        n = (1, 3, 8)[i % 3]
        out.append(Prompt(" ".join(_SENTENCES[(i + j) % len(_SENTENCES)] for j in range(n))))
    return out


def read_prompts(path: Path) -> list[Prompt]:
    """One JSON object per line: ``{"prompt": "...", "max_tokens": 64}`` (``max_tokens``
    optional); blank lines are skipped. A line that is not such an object is an error naming it."""
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
        text = row.get("prompt") if isinstance(row, dict) else None
        limit = row.get("max_tokens") if isinstance(row, dict) else None
        if not isinstance(text, str) or not text:
            raise ValueError(f'{path}:{number}: needs a non-empty string "prompt"')
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(f'{path}:{number}: "max_tokens" must be a positive integer')
        prompts.append(Prompt(text, limit))
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def speech_pcm(seconds: float, seed: int = 0, rate: int = AUDIO_RATE) -> bytes:
    """Voiced, syllable-paced audio (a 120 Hz glottal pulse train through two formants, loud
    and quiet four times a second): what a voice activity detector takes for speech."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    f0 = 120 * (1 + 0.08 * np.sin(2 * np.pi * 0.7 * t))
    pulses = np.sign(np.sin(2 * np.pi * np.cumsum(f0) / rate)) * 0.5
    voiced = pulses * (np.sin(2 * np.pi * 700 * t) + 0.6 * np.sin(2 * np.pi * 1200 * t))
    syllables = 0.55 + 0.45 * np.sin(2 * np.pi * 4 * t) ** 2
    wave_ = 0.25 * voiced * syllables + 0.003 * rng.standard_normal(n)
    return (np.clip(wave_, -1, 1) * 32767).astype("<i2").tobytes()


def wav(pcm16: bytes, rate: int = AUDIO_RATE) -> bytes:
    """Mono 16-bit PCM as a WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm16)
    return out.getvalue()


# Clip lengths (seconds) for transcription and realtime turns: a word, a sentence, a paragraph.
CLIP_SECONDS = (1.5, 4.0, 9.0)
