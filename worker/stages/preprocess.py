"""Preprocessing (CPU) of a plain language model: chat messages -> token ids through the
tokenizer's chat template. Model families (Qwen3-Omni, TTS, ASR) have their own, with their
processors, under ``worker/models/``.
"""

from __future__ import annotations

from typing import Any

from planner.spec import Executor
from worker.stages.base import RequestPreprocessor


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


class PreprocessExecutor(RequestPreprocessor):
    def load(self) -> None:
        self.tokenizer = load_tokenizer(self.ctx)

    def warmup(self) -> None:
        self.prepare({"kind": "chat", "messages": [{"role": "user", "content": "hi"}]})

    def prepare(self, req: dict[str, Any]) -> dict[str, Any]:
        if req["kind"] != "chat" or req.get("audio") is not None:
            raise ValueError(f"model {self.ctx.spec.name} takes text chat only")
        tools = {"tools": req["tools"]} if req.get("tools") else {}
        text = self.tokenizer.apply_chat_template(
            [dict(m) for m in req.get("messages", [])],
            tokenize=False,
            add_generation_prompt=True,
            **tools,
        )
        return {"input_ids": self.tokenizer.encode(text, add_special_tokens=False)}
