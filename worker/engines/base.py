"""The engine interface of the autoregressive stages: typed requests in, typed events out.

The stage host calls its executor's ``step`` whenever there is work; an executor backed by an
engine submits requests as they start, steps the engine once per ``step`` (one scheduler
iteration: a prefill chunk and/or one decode step of every running request) and turns the
events into its stage's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from worker.stages.grammar import Grammar
from worker.stages.sampling import Sampling


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
    # computed whole and never shared with other requests' prefixes (a talker needs every
    # prompt position's hidden state, which a cached prefix does not give again)
    private_prefix: bool = False


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


class Engine(Protocol):
    def submit(self, request: EngineRequest) -> None: ...

    def abort(self, rid: str) -> None: ...

    def step(self) -> list[EngineEvent]:
        """One scheduler iteration; the events of the requests it advanced."""
        ...

    def has_work(self) -> bool: ...

    def queue_depth(self) -> int: ...
