"""Qwen3-ASR's processor, as the model defines it: 16 kHz audio cut near pauses into clips of at
most 1200 s (180 s when timestamps are wanted: the forced aligner's limit), as the official
package cuts it; Whisper log-mel features (the checkpoint's ``preprocessor_config.json``); the
checkpoint's chat template with a system turn (optional context) and a user turn holding the
audio, one ``<|audio_pad|>`` per encoder output, and with a language hint the assistant turn
forced to start with ``language X<asr_text>`` (text-only output). The model's own output
otherwise starts with ``language X<asr_text>``: ``parse`` splits that off (language detection)
and collapses runaway repetitions as the package does."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worker.models.tokens import chat_text, decoded_text, token_text

RATE = 16_000
MAX_CLIP_SECONDS = 1200.0  # the package's MAX_ASR_INPUT_SECONDS
MAX_ALIGN_CLIP_SECONDS = 180.0  # MAX_FORCE_ALIGN_INPUT_SECONDS: clips that get timestamps
MIN_CLIP_SECONDS = 0.5  # a cut-off clip shorter than this is padded with silence
PAUSE_SEARCH_SECONDS = 5.0  # a cut lands within this of the limit, at the quietest point
PAUSE_WINDOW_SECONDS = 0.1  # loudness is summed over windows this long
ASR_TAG = "<asr_text>"
FEATURE_BATCH = 32  # clips per feature call (the package's max_inference_batch_size)
REPEAT_THRESHOLD = 20  # a character or phrase (<= 20 chars) said more often is said once


@dataclass
class Clip:
    ids: list[int]
    features: object  # torch.Tensor (mels, frames)
    start: float  # seconds from the start of the audio
    end: float
    samples: np.ndarray | None = None  # the clip's audio (the aligner hears it again)


def normalize(wav: np.ndarray) -> np.ndarray:
    """Float audio in [-1, 1]: scaled down if it peaks above full scale (int-like input)."""
    wav = np.asarray(wav, dtype=np.float32)
    peak = float(np.abs(wav).max()) if wav.size else 0.0
    if peak > 1.0:
        wav = wav / peak
    return np.clip(wav, -1.0, 1.0) if wav.size else wav


def cut_at_pauses(wav: np.ndarray, max_seconds: float) -> list[tuple[np.ndarray, float]]:
    """(clip, offset seconds) covering ``wav`` without gaps or overlaps: each cut near
    ``max_seconds`` into what is left, at the quietest sample of the quietest 100 ms window
    within 5 s either side; cut-off clips shorter than 0.5 s are padded with silence."""
    total, limit = wav.size, int(max_seconds * RATE)
    if total <= max_seconds * RATE:
        return [(wav, 0.0)]
    reach = int(PAUSE_SEARCH_SECONDS * RATE)
    win = max(4, int(PAUSE_WINDOW_SECONDS * RATE))
    bounds, start = [0], 0
    while total - start > limit:
        cut = start + limit
        lo, hi = max(start, cut - reach), min(total, cut + reach)
        if hi - lo > win:
            loud = np.abs(wav[lo:hi])
            quiet = int(np.argmin(np.convolve(loud, np.ones(win, dtype=np.float32), "valid")))
            cut = lo + quiet + int(np.argmin(loud[quiet : quiet + win]))
        start = min(max(cut, start + 1), total)
        bounds.append(start)
    bounds.append(total)
    least = int(MIN_CLIP_SECONDS * RATE)
    clips, offset = [], 0.0
    for a, b in itertools.pairwise(bounds):
        piece = wav[a:b]
        if piece.size < least:
            piece = np.pad(piece, (0, least - piece.size))
        clips.append((piece, offset))
        offset += (b - a) / RATE  # summed clip by clip, as the package sums its offsets
    return clips


def collapse_repeats(text: str, threshold: int = REPEAT_THRESHOLD) -> str:
    """A model stuck in a loop says a character, or a phrase of up to 20 characters, over and
    over: a run of more than ``threshold`` characters becomes one, and from the first phrase
    repeated ``threshold`` times on, each such run becomes one phrase (the package's rule)."""
    out, i = [], 0
    while i < len(text):
        j = i
        while j < len(text) and text[j] == text[i]:
            j += 1
        out.append(text[i] if j - i > threshold else text[i:j])
        i = j
    return _collapse_phrases("".join(out), threshold)


def _collapse_phrases(s: str, threshold: int, longest: int = 20) -> str:
    n = len(s)
    if n < 2 * threshold:
        return s
    for i in range(n - 2 * threshold + 1):
        for k in range(1, longest + 1):
            if i + k * threshold > n:
                break
            phrase = s[i : i + k]
            if all(s[i + r * k : i + (r + 1) * k] == phrase for r in range(1, threshold)):
                end = i + threshold * k
                while end + k <= n and s[end : end + k] == phrase:
                    end += k
                return s[:i] + phrase + _collapse_phrases(s[end:], threshold, longest)
    return s


class ASRProcessor:
    def __init__(self, checkpoint: Path) -> None:
        from transformers import AutoTokenizer, WhisperFeatureExtractor

        self.config = json.loads((checkpoint / "config.json").read_text())
        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        jinja = checkpoint / "chat_template.jinja"
        if jinja.is_file():
            self.template = jinja.read_text()
        else:
            self.template = json.loads((checkpoint / "chat_template.json").read_text())[
                "chat_template"
            ]
        self.features = WhisperFeatureExtractor.from_pretrained(checkpoint)
        tc = self.config["thinker_config"]
        self.audio_token = token_text(self.tokenizer, tc["audio_token_id"])
        self.languages = {
            str(x).lower(): str(x) for x in self.config.get("support_languages") or []
        }

    def language(self, name: str | None) -> str | None:
        """The model's spelling of a language hint; ValueError for one it does not know."""
        if not name:
            return None
        key = name.strip().lower()
        if key not in self.languages:
            raise ValueError(
                f"unsupported language {name!r}; supported: {sorted(self.languages.values())}"
            )
        return self.languages[key]

    def clips(
        self,
        wav: np.ndarray,
        language: str | None,
        context: str = "",
        max_seconds: float = MAX_CLIP_SECONDS,
    ) -> list[Clip]:
        import torch

        from worker.models.qwen3_asr.modeling import cnn_output_lengths

        wav = normalize(wav)
        pieces = cut_at_pauses(wav, max_seconds)
        text = self.prompt(context, language)
        out = []
        for first in range(0, len(pieces), FEATURE_BATCH):
            batch = pieces[first : first + FEATURE_BATCH]
            # One feature call per batch, as the package makes it: a shorter clip is padded
            # with silence to the longest (its last frames hear that silence), then cut back.
            f = self.features(
                [p for p, _ in batch],
                sampling_rate=RATE,
                padding="longest",  # what padding=True means; Whisper's __call__ is typed str
                truncation=False,
                return_attention_mask=True,
                return_tensors="pt",
            )
            for i, (piece, offset) in enumerate(batch):
                n = int(f["attention_mask"][i].sum())
                count = int(cnn_output_lengths(torch.tensor(n)))
                ids = self.tokenizer(
                    text.replace(self.audio_token, self.audio_token * count, 1),
                    add_special_tokens=False,
                )["input_ids"]
                end = min(offset + piece.size / RATE, wav.size / RATE)
                out.append(Clip(ids, f["input_features"][i][:, :n], offset, end, piece))
        return out

    def prompt(self, context: str, language: str | None) -> str:
        msgs: list[dict[str, Any]] = [
            {"role": "system", "content": context or ""},
            {"role": "user", "content": [{"type": "audio", "audio": ""}]},
        ]
        text = chat_text(
            self.tokenizer, msgs, chat_template=self.template, add_generation_prompt=True
        )
        return text + f"language {language}{ASR_TAG}" if language else text

    def decode(self, tokens: list[int]) -> str:
        return decoded_text(
            self.tokenizer, tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    @staticmethod
    def parse(raw: str, language: str | None) -> tuple[str, str]:
        """(language, text) from the model's output (a hint makes it plain text)."""
        s = collapse_repeats(raw.strip()) if raw.strip() else ""
        if not s:
            return "", ""
        if language:
            return language, s
        if ASR_TAG not in s:
            return "", s
        meta, text = s.split(ASR_TAG, 1)
        if "language none" in meta.lower():
            return "", text.strip()
        found = ""
        for line in meta.splitlines():
            line = line.strip()
            if line.lower().startswith("language "):
                name = line[len("language ") :].strip()
                found = name[:1].upper() + name[1:].lower()
                break
        return found, text.strip()
