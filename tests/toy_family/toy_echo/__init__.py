"""A toy model family kept outside the worker: the example of docs/omni-worker.md's "Adding a
model family", served through a worker by tests/test_toy_family.py from a copy of this folder.

``model_type: toy_echo``: a chat model without weights that answers with the words of the last
user message in reverse order, one word a step. What a real family adds is its modeling and
its weights; the rest is this: a package exporting ``FAMILY``, executors on
``worker.stages.base``, a spec.
"""

from __future__ import annotations

from typing import Any

from worker.contract.options import RequestInput
from worker.contract.stage_context import StageContext
from worker.models.family import Family
from worker.stages.base import DONE, OUT, REQUEST_INPUT, Output, RequestMeta, StageExecutor


class EchoExecutor(StageExecutor):
    """Each running request gives one word a step; all of them step together."""

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.running: dict[str, tuple[list[str], int, int]] = {}  # words left, prompt, limit

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        request: RequestInput = inputs[REQUEST_INPUT]
        said = next((m for m in reversed(request.messages) if m["role"] == "user"), {})
        content = said.get("content") or ""
        if not isinstance(content, str):  # content parts: their text
            content = " ".join(p.get("text", "") for p in content if p.get("type") == "text")
        words = content.split()
        limit = meta.max_tokens or self.ctx.stage.engine.max_new_tokens
        self.running[rid] = (words[::-1], len(words), limit)

    def abort(self, rid: str) -> None:
        self.running.pop(rid, None)

    def next_deadline(self) -> float | None:
        return 0.0 if self.running else None

    def queue_depth(self) -> int:
        return len(self.running)

    def step(self) -> list[Output]:
        outs: list[Output] = []
        for rid, (words, prompt, limit) in list(self.running.items()):
            said = prompt - len(words)
            if words and said < limit:
                outs.append((OUT, rid, ("text", ("" if said == 0 else " ") + words.pop(0))))
                continue
            del self.running[rid]
            info = {"prompt_tokens": prompt, "completion_tokens": said}
            outs.append((DONE, rid, {**info, "finish_reason": "length" if words else "stop"}))
        return outs


def make_executor(ctx: StageContext) -> StageExecutor:
    return EchoExecutor(ctx)


FAMILY = Family("Toy echo", "toy_echo", make_executor)
