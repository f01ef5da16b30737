"""Decode (CPU): the thinker's token stream -> text deltas for the client.

Incremental detokenization over a sliding window (as vLLM does): the text of
``tokens[prefix:]`` minus that of ``tokens[prefix:read]`` is new, unless it ends in a partial
UTF-8 character (``\\ufffd``), which waits for the next token. The window keeps decoding cost
per token constant and gives context-dependent tokenizers (leading spaces) their context.
"""

from __future__ import annotations

from typing import Any

from worker.stages.base import DONE, OUT, Output, RequestMeta, StageExecutor
from worker.stages.preprocess import load_tokenizer


class _Text:
    __slots__ = ("dirty", "ended", "info", "prefix", "read", "tokens")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.prefix = 0  # start of the decoding window
        self.read = 0  # tokens before this are already in the emitted text
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
            decode = self.tokenizer.decode
            done = decode(t.tokens[t.prefix : t.read], skip_special_tokens=True)
            text = decode(t.tokens[t.prefix :], skip_special_tokens=True)
            if len(text) > len(done) and (t.ended or not text.endswith("\ufffd")):
                outs.append((OUT, rid, ("text", text[len(done) :])))
                t.prefix, t.read = t.read, len(t.tokens)
            if t.ended:
                del self.reqs[rid]
                outs.append((DONE, rid, t.info))
        return outs
