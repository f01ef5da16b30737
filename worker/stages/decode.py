"""Decode (CPU): the thinker's token stream -> text deltas for the client.

Incremental detokenization over a sliding window (as vLLM does): the text of
``tokens[prefix:]`` minus that of ``tokens[prefix:read]`` is new, unless it ends in a partial
UTF-8 character (``\\ufffd``), which waits for the next token. The window keeps decoding cost
per token constant and gives context-dependent tokenizers (leading spaces) their context.

A request's ``stop`` texts end its reply where the first of them appears: the text before it
is sent, the stop text is not, and the stage reports ``finish_reason`` "stop" at once (the
coordinator then ends the request in every stage). Text that could be the start of a stop
text is held back until the next tokens show whether it is.

Each piece of the token stream as it was fed (one token per thinker step) is decoded on its
own, even when several wait for one step: the deltas a client receives are then the same on
every run and every worker, whatever the load, which is what lets the router resume a stream
on another worker exactly (docs/reliability.md).
"""

from __future__ import annotations

from typing import Any

from worker.stages.base import DONE, OUT, Output, RequestMeta, StageExecutor
from worker.stages.payloads import TokenPiece
from worker.stages.preprocess import load_tokenizer


class _Text:
    __slots__ = (
        "cached_tokens",
        "cuts",
        "ended",
        "held",
        "info",
        "logprobs",
        "pending",
        "prefix",
        "prompt_tokens",
        "read",
        "stops",
        "tokens",
    )  # fmt: skip

    def __init__(self, stops: tuple[str, ...] = ()) -> None:
        self.stops = stops
        self.held = ""  # text that may begin a stop text, not sent yet
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.tokens: list[int] = []
        self.logprobs: list[tuple] = []  # per token (when asked): (logprob, [(id, logprob)])
        # (token text, logprob, [(text, logprob)]) of tokens whose text is not sent yet
        self.pending: list[tuple] = []
        self.prefix = 0  # start of the decoding window
        self.read = 0  # tokens before this are already in the emitted text
        self.cuts: list[int] = []  # where each fed piece of the stream ends, not decoded yet
        self.ended = False
        self.info: dict[str, Any] = {}


class DecodeExecutor(StageExecutor):
    def load(self) -> None:
        self.tokenizer = load_tokenizer(self.ctx)
        self.reqs: dict[str, _Text] = {}

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        self.reqs.setdefault(rid, _Text(tuple(s for s in meta.stop if s)))

    def feed(self, rid: str, src: str, data: Any) -> None:
        t = self.reqs.get(rid)
        if t is not None:
            piece: TokenPiece = data
            t.tokens.extend(piece.tokens)
            t.logprobs.extend(piece.logprobs)
            if piece.prompt_tokens is not None:
                t.prompt_tokens, t.cached_tokens = piece.prompt_tokens, piece.cached_tokens
            t.cuts.append(len(t.tokens))

    def end_stream(self, rid: str, src: str, info: dict[str, Any]) -> None:
        t = self.reqs.get(rid)
        if t is not None:
            t.ended = True
            t.info = dict(info)

    def abort(self, rid: str) -> None:
        self.reqs.pop(rid, None)

    def next_deadline(self) -> float | None:
        return 0.0 if any(t.cuts or t.ended for t in self.reqs.values()) else None

    def queue_depth(self) -> int:
        return len(self.reqs)

    def step(self) -> list[Output]:
        outs: list[Output] = []
        for rid, t in list(self.reqs.items()):
            cuts, t.cuts = t.cuts, []
            if t.ended and (not cuts or cuts[-1] != len(t.tokens)):
                cuts.append(len(t.tokens))  # the last pass: what was held back goes out
            for n, upto in enumerate(cuts):
                last = t.ended and n == len(cuts) - 1
                if self._piece(rid, t, upto, last, outs):
                    break  # a stop text ended the reply
            else:
                if t.ended:
                    del self.reqs[rid]
                    outs.append((DONE, rid, t.info))
        return outs

    def _piece(self, rid: str, t: _Text, upto: int, last: bool, outs: list[Output]) -> bool:
        """The text delta of ``tokens[:upto]`` (True: a stop text ended the reply)."""
        decode = self.tokenizer.decode
        done = decode(t.tokens[t.prefix : t.read], skip_special_tokens=True)
        text = decode(t.tokens[t.prefix : upto], skip_special_tokens=True)
        new = ""
        if len(text) > len(done) and (last or not text.endswith("\ufffd")):
            new = text[len(done) :]
            if t.logprobs:
                t.pending += self._entries(t, t.read, upto)
            t.prefix, t.read = t.read, upto
        if t.stops:
            new, stopped = _scan(t, new)
            if stopped:
                if new:
                    outs.append((OUT, rid, _text(t, new)))
                del self.reqs[rid]
                info = {"finish_reason": "stop", "prompt_tokens": t.prompt_tokens,
                        "completion_tokens": len(t.tokens),
                        "cached_tokens": t.cached_tokens, "stop_text": True}  # fmt: skip
                outs.append((DONE, rid, info))
                return True
            if last:  # what was held back is the reply's end after all
                new, t.held = new + t.held, ""
        if new:
            outs.append((OUT, rid, _text(t, new)))
        return False

    def _entries(self, t: _Text, start: int, end: int) -> list[tuple]:
        """The log probabilities of tokens ``start:end``, with their texts."""
        text = self.tokenizer.decode
        return [
            (text([tok]), lp, [(text([i]), v) for i, v in alts])
            for tok, (lp, alts) in zip(t.tokens[start:end], t.logprobs[start:end], strict=True)
        ]


def _text(t: _Text, text: str) -> tuple:
    """An output text delta, with the log probabilities of the tokens it completes."""
    if not t.logprobs:
        return ("text", text)
    entries, t.pending = t.pending, []
    return ("text", text, entries)


def _scan(t: _Text, new: str) -> tuple[str, bool]:
    """(text to send now, whether a stop text was found): the held text and ``new`` up to the
    earliest stop text, else all but a tail that may begin one."""
    text = t.held + new
    found = [i for i in (text.find(s) for s in t.stops) if i >= 0]
    if found:
        t.held = ""
        return text[: min(found)], True
    longest = max(len(s) for s in t.stops) - 1
    hold = next(
        (k for k in range(min(longest, len(text)), 0, -1)
         if any(s.startswith(text[-k:]) for s in t.stops)),
        0,
    )  # fmt: skip
    t.held = text[len(text) - hold :]
    return text[: len(text) - hold], False
