"""Decode (CPU): the thinker's token stream -> text deltas for the client.

Decodes the whole sequence and emits what is new, holding back a trailing partial UTF-8
character (``\\ufffd``) until the next token completes it.
"""

from __future__ import annotations

from typing import Any

from worker.stages.base import DONE, OUT, Output, RequestMeta, StageExecutor
from worker.stages.preprocess import load_tokenizer


class _Text:
    __slots__ = ("dirty", "ended", "info", "sent", "tokens")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.sent = ""
        self.dirty = False
        self.ended = False
        self.info: dict[str, Any] = {}


class DecodeExecutor(StageExecutor):
    def load(self) -> None:
        self.tokenizer = load_tokenizer(self.ctx)
        self.reqs: dict[str, _Text] = {}

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        self.reqs.setdefault(rid, _Text())

    def feed(self, rid: str, src: str, data: Any) -> None:
        t = self.reqs.get(rid)
        if t is not None:
            t.tokens.extend(data["tokens"])
            t.dirty = True

    def end_stream(self, rid: str, src: str, info: dict[str, Any]) -> None:
        t = self.reqs.get(rid)
        if t is not None:
            t.ended, t.dirty = True, True
            t.info = dict(info)

    def abort(self, rid: str) -> None:
        self.reqs.pop(rid, None)

    def next_deadline(self) -> float | None:
        return 0.0 if any(t.dirty for t in self.reqs.values()) else None

    def queue_depth(self) -> int:
        return len(self.reqs)

    def step(self) -> list[Output]:
        outs: list[Output] = []
        for rid, t in list(self.reqs.items()):
            if not t.dirty:
                continue
            t.dirty = False
            text = self.tokenizer.decode(t.tokens, skip_special_tokens=True)
            if not t.ended and text.endswith("\ufffd"):
                text = text[:-1]
            if len(text) > len(t.sent) and text.startswith(t.sent):
                outs.append((OUT, rid, ("text", text[len(t.sent) :])))
                t.sent = text
            if t.ended:
                del self.reqs[rid]
                outs.append((DONE, rid, t.info))
        return outs
