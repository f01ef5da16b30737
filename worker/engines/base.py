"""The engine interface of the autoregressive stages: typed requests in, typed events out.

The stage host calls its executor's ``step`` whenever there is work; an executor backed by an
engine submits requests as they start, steps the engine once per ``step`` (one scheduler
iteration: a prefill chunk and/or one decode step of every running request) and turns the
events into its stage's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from worker.contract.grammar import Grammar
from worker.contract.sampling import Sampling


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A generated token's log probability and its likeliest rivals (token, logprob)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True)
class EngineRequest:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    sampling: Sampling = field(default_factory=Sampling)
    stop_token_ids: frozenset[int] = frozenset()
    logprobs: int | None = None  # None: none; N: each token's with its N likeliest rivals
    grammar: Grammar | None = None
    # the family's multimodal inputs in the engine's own form (embeddings from the encoder
    # stages, rope positions), built by the family's executor
    multimodal: Any = None
    # requests share cached prefixes with the others of their namespace only (None: the
    # common one; a namespace of its own: computed whole)
    prefix_namespace: str | None = None


@dataclass(slots=True)
class EngineEvent:
    """What one step did for one request: new tokens (with their log probabilities when asked),
    and, when it ended, why (``stop``, ``length``, or ``abort`` with ``error``)."""

    rid: str
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish: str | None = None
    error: str | None = None
    cached_tokens: int = 0  # prompt tokens served from the prefix cache

    def reply(self, stop_tokens: frozenset[int]) -> tuple[list[int], list[TokenLogprob]]:
        """Its tokens of the reply and their log probabilities: the stop token that ended the
        request (both engines send it) is not part of the reply."""
        if self.finish == "stop" and self.tokens and self.tokens[-1] in stop_tokens:
            n = len(self.tokens) - 1
            return self.tokens[:n], self.logprobs[:n]
        return self.tokens, self.logprobs


@dataclass(frozen=True, slots=True)
class ForwardTrace:
    """What one model forward ran (an engine's ``on_forward`` callback gets it): the requests
    in batch order and how many new positions each had (prompt tokens in a prefill chunk, 1 in
    a decode step). A family's model that captures tensors for another stage (the Qwen3-Omni
    thinker's hidden states for its talker) shares them out by it."""

    rids: list[str]
    lengths: list[int]
    prefill: bool


class Engine(Protocol):
    def submit(self, request: EngineRequest) -> None: ...

    def abort(self, rid: str) -> None: ...

    def step(self) -> list[EngineEvent]:
        """One scheduler iteration; the events of the requests it advanced."""
        ...

    def has_work(self) -> bool: ...

    def queue_depth(self) -> int: ...
