"""Qwen3-ASR's processor, as the model defines it: 16 kHz audio in clips of at most 30 s,
Whisper log-mel features (the checkpoint's ``preprocessor_config.json``), the checkpoint's chat
template with a system turn (optional context) and a user turn holding the audio, one
``<|audio_pad|>`` per encoder output, and with a language hint the assistant turn forced to
start with ``language X<asr_text>`` (text-only output). The model's own output otherwise starts
with ``language X<asr_text>``: ``parse`` splits that off (language detection)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RATE = 16_000
CLIP_SECONDS = 30
ASR_TAG = "<asr_text>"


@dataclass
class Clip:
    ids: list[int]
    features: object  # torch.Tensor (mels, frames)
    start: float  # seconds from the start of the audio
    end: float


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
        self.audio_token = self.tokenizer.convert_ids_to_tokens(tc["audio_token_id"])
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

    def clips(self, wav: np.ndarray, language: str | None, context: str = "") -> list[Clip]:
        import torch

        from worker.models.qwen3_asr.modeling import cnn_output_lengths

        wav = np.asarray(wav, dtype=np.float32)
        peak = float(np.abs(wav).max()) if wav.size else 0.0
        if peak > 1.0:
            wav = wav / peak
        step = CLIP_SECONDS * RATE
        out = []
        for start in range(0, max(wav.size, 1), step):
            piece = wav[start : start + step]
            f = self.features(
                [piece],
                sampling_rate=RATE,
                padding=True,
                truncation=False,
                return_attention_mask=True,
                return_tensors="pt",
            )
            n = int(f["attention_mask"].sum())
            feats = f["input_features"][0][:, :n]
            msgs = [
                {"role": "system", "content": context or ""},
                {"role": "user", "content": [{"type": "audio", "audio": ""}]},
            ]
            text = self.tokenizer.apply_chat_template(
                msgs, chat_template=self.template, add_generation_prompt=True, tokenize=False
            )
            if language:
                text += f"language {language}{ASR_TAG}"
            count = int(cnn_output_lengths(torch.tensor(n)))
            text = text.replace(self.audio_token, self.audio_token * count, 1)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Clip(ids, feats, start / RATE, (start + piece.size) / RATE))
        return out

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(
            tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    @staticmethod
    def parse(raw: str, language: str | None) -> tuple[str, str]:
        """(language, text) from the model's output (a hint makes it plain text)."""
        s = raw.strip()
        if language:
            return language, s
        if ASR_TAG not in s:
            return "", s
        meta, text = s.split(ASR_TAG, 1)
        found = ""
        for line in meta.splitlines():
            line = line.strip()
            if line.lower().startswith("language "):
                found = line[len("language ") :].strip()
        if found.lower() == "none":
            found = ""
        return found, text.strip()
