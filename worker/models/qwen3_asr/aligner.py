"""Qwen3-ForcedAligner, written for omni-fleet: word timestamps for a transcript of a clip.

The aligner is a Qwen3-ASR model (``thinker_config.model_type: qwen3_forced_aligner``) whose
head classifies every position into ``classify_num`` time slots of ``timestamp_segment_time``
ms. Its prompt is the clip's audio placeholders followed by the transcript's words, each word
followed by two ``<timestamp>`` tokens (its start and end); one causal forward pass, and the
slot predicted at each ``<timestamp>`` is that word boundary's time. Words are what the model
was trained on: whitespace-separated runs of letters, digits and apostrophes, every CJK
character a word of its own. Predicted times that break the order are repaired as the official
package repairs them (the longest non-decreasing run is kept; up to two stray times take a
neighbour's value, longer runs are spread evenly between their neighbours).
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from worker.layers.resample import resample
from worker.models.tokens import token_text

TIMESTAMP = "<timestamp>"
AUDIO_PROMPT = "<|audio_start|><|audio_pad|><|audio_end|>"
ALIGNER_DIR = "forced_aligner"  # where a served checkpoint keeps its aligner (component dir)


@dataclass(frozen=True)
class Word:
    word: str
    start: float  # seconds from the start of the whole audio
    end: float


def _kept(ch: str) -> bool:
    return ch == "'" or unicodedata.category(ch)[0] in "LN"


def _cjk(ch: str) -> bool:
    c = ord(ch)
    return (
        0x4E00 <= c <= 0x9FFF
        or 0x3400 <= c <= 0x4DBF
        or 0x20000 <= c <= 0x2A6DF
        or 0x2A700 <= c <= 0x2B73F
        or 0x2B740 <= c <= 0x2B81F
        or 0x2B820 <= c <= 0x2CEAF
        or 0xF900 <= c <= 0xFAFF
    )


def split_words(text: str) -> list[str]:
    """The aligner's words: whitespace-separated, cleaned of everything but letters, digits and
    apostrophes, CJK characters split off one by one. (The package segments Japanese with nagisa
    and Korean with soynlp; here those follow the same rule as every other language.)"""
    words: list[str] = []
    for part in text.split():
        cleaned = "".join(ch for ch in part if _kept(ch))
        run = ""
        for ch in cleaned:
            if _cjk(ch):
                if run:
                    words.append(run)
                    run = ""
                words.append(ch)
            else:
                run += ch
        if run:
            words.append(run)
    return words


def repair_order(times: list[float]) -> list[int]:
    """Predicted boundary times made non-decreasing (the package's ``fix_timestamp``)."""
    n = len(times)
    if n == 0:
        return []
    best, parent = [1] * n, [-1] * n
    for i in range(1, n):
        for j in range(i):
            if times[j] <= times[i] and best[j] + 1 > best[i]:
                best[i], parent[i] = best[j] + 1, j
    normal = [False] * n
    k = best.index(max(best))
    while k != -1:
        normal[k], k = True, parent[k]
    out = list(times)
    i = 0
    while i < n:
        if normal[i]:
            i += 1
            continue
        j = i
        while j < n and not normal[j]:
            j += 1
        left = next((out[k] for k in range(i - 1, -1, -1) if normal[k]), None)
        right = next((out[k] for k in range(j, n) if normal[k]), None)
        if left is not None and right is not None:
            if j - i <= 2:  # a short run takes its nearer neighbour's time
                for k in range(i, j):
                    out[k] = left if (k - (i - 1)) <= (j - k) else right
            else:
                step = (right - left) / (j - i + 1)
                for k in range(i, j):
                    out[k] = left + step * (k - i + 1)
        else:  # at an end: the one neighbour's time (the kept times are never empty)
            edge = left if left is not None else right
            if edge is not None:
                for k in range(i, j):
                    out[k] = edge
        i = j
    return [int(t) for t in out]


SAMPLE_RATE = 16_000  # Hz: what the aligner hears


def to_aligner_rate(pcm: np.ndarray, rate: int) -> np.ndarray:
    """int16 mono at ``rate`` -> float32 at the aligner's 16 kHz, resampled as a transcription's
    upload is (worker.layers.resample)."""
    return resample(pcm.astype(np.float32) / 32768.0, rate, SAMPLE_RATE)


class ForcedAligner:
    """The aligner checkpoint's model, tokenizer and feature extractor, and ``align``."""

    def __init__(self, model: Any, checkpoint: Path) -> None:
        from transformers import AutoTokenizer, WhisperFeatureExtractor

        self.model = model
        self.config = json.loads((checkpoint / "config.json").read_text())
        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        self.features = WhisperFeatureExtractor.from_pretrained(checkpoint)
        tc = self.config["thinker_config"]
        self.audio_id = tc["audio_token_id"]
        self.audio_token = token_text(self.tokenizer, self.audio_id)
        self.timestamp_id = int(self.config["timestamp_token_id"])
        self.slot_ms = float(self.config["timestamp_segment_time"])

    def prompt(self, words: list[str], outputs: int) -> list[int]:
        text = AUDIO_PROMPT + (TIMESTAMP * 2).join(words) + TIMESTAMP * 2
        text = text.replace(self.audio_token, self.audio_token * outputs, 1)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def align(self, clips: list[tuple[np.ndarray, str, float]], device: str = "cpu") -> list[Word]:
        """Words with times for clips of (16 kHz audio, transcript, offset in seconds); the
        clips' features are computed in one call, as the package batches the clips it aligns
        (a shorter clip hears silence padded to the longest)."""
        import torch

        from worker.layers.qwen3_decoder import KVCache
        from worker.models.qwen3_asr.modeling import cnn_output_lengths

        if not clips:
            return []
        f = self.features(
            [wav for wav, _, _ in clips],
            sampling_rate=SAMPLE_RATE,
            padding="longest",  # what padding=True means; Whisper's __call__ is typed str
            truncation=False,
            return_attention_mask=True,
            return_tensors="pt",
        )
        th = self.model.thinker
        out: list[Word] = []
        for i, (_, text, offset) in enumerate(clips):
            words = split_words(text)
            n = int(f["attention_mask"][i].sum())
            ids = torch.tensor([self.prompt(words, int(cnn_output_lengths(torch.tensor(n))))])
            ids = ids.to(device)
            with torch.inference_mode():
                x = th.model.embed_tokens(ids)
                feats = f["input_features"][i][:, :n].to(device, x.dtype)
                x[0, ids[0] == self.audio_id] = th.audio_tower(feats).to(x.dtype)
                h = th.model.prefill(x, KVCache.empty(th.model.s.num_layers))
                slots = th.logits(h[0, ids[0] == self.timestamp_id]).argmax(-1)
            ms = repair_order([float(s) * self.slot_ms for s in slots.tolist()])
            for k, word in enumerate(words):
                start = round(round(ms[2 * k] / 1000.0, 3) + offset, 3)
                end = round(round(ms[2 * k + 1] / 1000.0, 3) + offset, 3)
                out.append(Word(word, start, end))
        return out
