"""Preprocessing (CPU) of a plain language model: chat messages -> token ids through the
tokenizer's chat template; a text completion's prompt -> its token ids as they are. Model
families (Qwen3-Omni, TTS, ASR) have their own, with their processors, under ``worker/models/``.
"""

from __future__ import annotations

from typing import Any

from planner.spec import Executor
from worker.contract.options import RequestInput
from worker.stages.base import RequestPreprocessor
from worker.stages.payloads import PromptIds


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


def completion_ids(req: RequestInput, tokenizer: Any) -> list[int]:
    """A text completion's prompt as token ids: given as ids (each one the tokenizer knows), or
    its text tokenized as it is (no chat template, no special tokens added)."""
    if req.prompt_ids is not None:
        ids = req.prompt_ids
        vocab = len(tokenizer)
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is not in the vocabulary (0..{vocab - 1})")
    else:
        ids = tokenizer.encode(req.text, add_special_tokens=False)
    if not ids:
        raise ValueError("the prompt is empty")
    return ids


class PreprocessExecutor(RequestPreprocessor[RequestInput]):
    def load(self) -> None:
        self.tokenizer = load_tokenizer(self.ctx)

    def warmup(self) -> None:
        self.prepare(RequestInput("chat", [{"role": "user", "content": "hi"}]))

    def prepare(self, req: RequestInput) -> PromptIds:
        if req.kind == "completion":
            return PromptIds(completion_ids(req, self.tokenizer))
        if req.kind != "chat" or req.audio is not None:
            raise ValueError(f"model {self.ctx.spec.name} takes text chat only")
        tools = {"tools": req.tools} if req.tools else {}
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in req.messages],
            tokenize=False,
            add_generation_prompt=True,
            **tools,
        )
        return PromptIds(self.tokenizer.encode(text, add_special_tokens=False))
