"""Preprocessing (CPU): a request -> token ids (chat template) and audio features.

Chat: the messages through the tokenizer's chat template; input audio becomes a placeholder
token that the thinker replaces by audio-encoder embeddings. Speech: the text's tokens, which
the thinker encodes without generating ("forced" mode) so the talker speaks exactly that text.
Transcription: a system instruction plus the audio placeholder.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.spec import Executor
from worker.stages.base import FINAL, INVALID, Output, RequestMeta, StageExecutor

AUDIO_PLACEHOLDER = "<|audio_start|><|audio|><|audio_end|>"
TRANSCRIBE_PROMPT = "Transcribe the audio."


def load_tokenizer(ctx) -> Any:
    """The tokenizer at the checkpoint root, else in the first autoregressive component."""
    from transformers import AutoTokenizer

    candidates = [ctx.checkpoint] + [
        ctx.component_dir(n)
        for n, s in ctx.spec.stages.items()
        if s.executor == Executor.AUTOREGRESSIVE
    ]
    for path in candidates:
        if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(path)
    raise FileNotFoundError(f"no tokenizer in {[str(p) for p in candidates]}")


class PreprocessExecutor(StageExecutor):
    def load(self) -> None:
        self.tokenizer = load_tokenizer(self.ctx)
        self.feature_extractor = None
        encoders = [n for n, s in self.ctx.spec.stages.items() if s.executor == Executor.ENCODER]
        if encoders:
            from transformers import AutoFeatureExtractor

            self.feature_extractor = AutoFeatureExtractor.from_pretrained(
                self.ctx.component_dir(encoders[0])
            )
        self.pending: list[tuple[str, RequestMeta, dict]] = []

    def warmup(self) -> None:
        self._prepare(RequestMeta("chat", frozenset({"text"})), _warm_request())

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        self.pending.append((rid, meta, inputs["request"]))

    def abort(self, rid: str) -> None:
        self.pending = [p for p in self.pending if p[0] != rid]

    def next_deadline(self) -> float | None:
        return 0.0 if self.pending else None

    def queue_depth(self) -> int:
        return len(self.pending)

    def step(self) -> list[Output]:
        rid, meta, req = self.pending.pop(0)
        try:
            return [(FINAL, rid, self._prepare(meta, req))]
        except ValueError as exc:
            return [(INVALID, rid, str(exc))]

    def _prepare(self, meta: RequestMeta, req: dict[str, Any]) -> dict[str, Any]:
        kind = req["kind"]
        audio = req.get("audio")
        if kind == "speech":
            text, mode = req.get("text", ""), "forced"
            if not text.strip():
                raise ValueError("speech request without text")
        else:
            mode = "generate"
            if kind == "transcription":
                if audio is None:
                    raise ValueError("transcription request without audio")
                messages = [
                    {"role": "system", "content": TRANSCRIBE_PROMPT},
                    {"role": "user", "content": AUDIO_PLACEHOLDER},
                ]
            else:
                messages = [dict(m) for m in req.get("messages", [])]
                if audio is not None:
                    users = [m for m in messages if m.get("role") == "user"] or messages
                    if not users:
                        messages.append({"role": "user", "content": ""})
                        users = messages
                    users[-1]["content"] = AUDIO_PLACEHOLDER + str(users[-1].get("content", ""))
            text = self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        out: dict[str, Any] = {"input_ids": ids, "mode": mode, "voice": req.get("voice")}
        if audio is not None:
            out["audio_features"], out["audio_samples"] = self._features(audio)
        if req.get("voice_audio") is not None and "audio" in meta.outputs:
            out["voice_features"], out["voice_samples"] = self._features(req["voice_audio"])
        return out

    def _features(self, audio: np.ndarray) -> tuple[np.ndarray, int]:
        """Log-mel features in fixed clips (the encoder's window), as Whisper encoders want."""
        if self.feature_extractor is None:
            raise ValueError(f"model {self.ctx.spec.name} has no audio encoder: audio input")
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if audio.size == 0:
            raise ValueError("empty audio")
        fe = self.feature_extractor
        clip = int(fe.n_samples)
        clips = [audio[i : i + clip] for i in range(0, audio.size, clip)]
        feats = fe(clips, sampling_rate=fe.sampling_rate, return_tensors="np")["input_features"]
        return feats.astype(np.float32), int(audio.size)


def _warm_request() -> dict[str, Any]:
    return {
        "kind": "chat",
        "messages": [{"role": "user", "content": "hi"}],
        "audio": np.zeros(1600, dtype=np.float32),
    }
