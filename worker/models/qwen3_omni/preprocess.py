"""Preprocessing (CPU): a request -> Qwen3-Omni's model inputs, through the model's processor.

Completion: the prompt's tokens as they are, no template. Chat: the messages as they are (text,
audio and image parts). Transcription: the audio with an instruction (naming the language hint),
after the request's prompt as the system's context. Speech: the text to speak is forced as the
assistant's reply, so the talker voices exactly that text (the thinker encodes it instead of
generating).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from worker.contract.options import RequestInput, TranscriptionOptions
from worker.models.qwen3_omni.payloads import OmniPrompt
from worker.models.qwen3_omni.processor import OmniProcessor, media_parts
from worker.stages.base import RequestPreprocessor
from worker.stages.preprocess import completion_ids

TRANSCRIBE_INSTRUCTION = "Transcribe the audio into text."
TRANSLATE_INSTRUCTION = "Translate the audio into English text."


class OmniPreprocess(RequestPreprocessor[RequestInput]):
    def load(self) -> None:
        self.processor = OmniProcessor(self.ctx.checkpoint)
        # the thinker's context: a prompt that cannot fit is refused before any encoder runs
        self.context_length = next(
            (
                s.engine.context_length
                for s in self.ctx.spec.stages.values()
                if s.component is not None and s.component.module == "thinker"
            ),
            None,
        )

    def warmup(self) -> None:
        silence = np.zeros(1600, dtype=np.float32)
        content = [{"type": "audio", "audio": silence}, {"type": "text", "text": "hi"}]
        self.prepare(RequestInput("chat", [{"role": "user", "content": content}]))

    def prepare(self, req: RequestInput) -> OmniPrompt:
        kind = req.kind
        if kind == "completion":
            ids = completion_ids(req, self.processor.tokenizer)
            self._check_length(len(ids))
            return OmniPrompt(ids)
        forced: list[int] | None = None
        if kind == "speech":
            text = req.text
            if not text.strip():
                raise ValueError("speech request without text")
            messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
            forced = self.processor.tokenizer.encode(text, add_special_tokens=False)
        elif kind == "transcription":
            if req.audio is None:
                raise ValueError("transcription request without audio")
            opts = req.transcription or TranscriptionOptions()
            instruction = TRANSLATE_INSTRUCTION if opts.translate else TRANSCRIBE_INSTRUCTION
            if opts.language:
                instruction += f" The audio is in {opts.language}."
            content = [{"type": "audio", "audio": req.audio}, {"type": "text", "text": instruction}]
            # the request's prompt (words, spellings, the text before) as the system's context
            messages = [{"role": "system", "content": opts.prompt}] if opts.prompt else []
            messages.append({"role": "user", "content": content})
        else:  # a chat: each media part stands in its own turn, in order (worker.api.chat)
            messages = [dict(m) for m in req.messages]
        for part in media_parts(messages, "audio"):
            if np.asarray(part["audio"]).size == 0:
                raise ValueError("empty audio")
        prepared = self.processor.prepare(messages, req.tools)
        self._check_length(len(prepared.input_ids))
        prepared.voice = req.voice
        prepared.forced_ids = forced
        return prepared

    def _check_length(self, n: int) -> None:
        if self.context_length is not None and n >= self.context_length:
            raise ValueError(
                f"prompt of {n} tokens exceeds the context length {self.context_length}"
            )
