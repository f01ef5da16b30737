"""The stage executor interface that the stage process host drives.

The host hands a request to an executor with ``start`` once all its required inputs arrived,
forwards stream chunks with ``feed``/``end_stream``, and calls ``step`` whenever
``next_deadline`` says there is work (the executor's scheduler decides what one step is: a
batch, one decode step of all running requests, ...). ``step`` returns outputs (the kinds of
``worker.stages.messages``) that the process hands to the stages they are for: in place when
those run in this process, through the coordinator when they run in another.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from worker.contract.grammar import Grammar
from worker.contract.sampling import Sampling
from worker.contract.stage_context import StageContext
from worker.stages.messages import (
    CHUNK,
    DONE,
    END,
    ERROR,
    FINAL,
    INVALID,
    OUT,
    REQUEST_INPUT,
    Output,
)

# The output kinds of ``step`` belong to the runtime's one message vocabulary; executors take
# them from here, with the rest of their interface.
from worker.stages.payloads import Gathered

In = TypeVar("In")
T = TypeVar("T")

__all__ = [
    "CHUNK",
    "DONE",
    "END",
    "ERROR",
    "FINAL",
    "INVALID",
    "OUT",
    "REQUEST_INPUT",
    "BatchQueue",
    "Output",
    "RequestMeta",
    "RequestPreprocessor",
    "StageExecutor",
    "input_of",
    "inputs_of",
]


def inputs_of(inputs: dict[str, Any], kind: type[T]) -> list[T]:
    """The inputs of ``start`` that are a ``kind``, whichever stages sent them (the spec names
    the stages; a stage knows its inputs by their type), those an aggregate gathered included,
    in the order of their stages' names."""
    found: list[T] = []
    for name in sorted(inputs):
        value = inputs[name]
        for part in value.parts if isinstance(value, Gathered) else [value]:
            if isinstance(part, kind):
                found.append(part)
    return found


def input_of(inputs: dict[str, Any], kind: type[T]) -> T:
    """The one input of ``start`` that is a ``kind`` (``inputs_of``)."""
    found = inputs_of(inputs, kind)
    if len(found) != 1:
        got = {k: type(v).__name__ for k, v in inputs.items()}
        raise TypeError(f"expected one {kind.__name__} among the stage's inputs, got {got}")
    return found[0]


@dataclass(slots=True)
class RequestMeta:
    kind: str  # RequestKind value
    outputs: frozenset[str]  # {"text"}, {"audio"}, {"text", "audio"}
    max_tokens: int | None = None
    stream_targets: tuple[str, ...] = ()  # active stages this stage streams to
    sampling: Sampling | None = None  # how the text decoder picks tokens (None: greedy)
    stop: tuple[str, ...] = ()  # texts that end the reply where they appear (not sent)
    logprobs: int | None = None  # None: none; N: each token's, with its N likeliest rivals
    grammar: Grammar | None = None  # what the reply must be (response_format); None: free
    # how the talker picks its codes (None: as the checkpoint says; worker.layers.talker_sampling)
    speech_sampling: Sampling | None = None


class StageExecutor(ABC):
    """What ``start``/``feed`` receive is shared, not copied: a payload from a stage of the same
    process arrives as that stage produced it (torch tensors on its device included), one from
    another process as numpy arrays. Executors read their inputs and never modify them."""

    def __init__(self, ctx: StageContext) -> None:
        self.ctx = ctx

    def load(self) -> None:  # noqa: B027 - optional hook
        """Load weights; called once in the stage process before ``warmup``."""

    def warmup(self) -> None:  # noqa: B027 - optional hook
        """Run a dummy pass so the first request does not pay for lazy initialisation."""

    def close(self) -> None:
        """Give up what the stage holds for its process: an autoregressive stage's SGLang
        engine (``engine``) its process-wide state, so that another can load in this process
        after it (a stage process runs one for its life; tests run several in turn)."""
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()

    @abstractmethod
    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None: ...

    def feed(self, rid: str, src: str, data: Any) -> None:
        raise RuntimeError(f"stage {self.ctx.name} takes no stream input (from {src})")

    def end_stream(self, rid: str, src: str, info: dict[str, Any]) -> None:
        raise RuntimeError(f"stage {self.ctx.name} takes no stream input (from {src})")

    @abstractmethod
    def abort(self, rid: str) -> None:
        """Forget the request and free what it holds; unknown ids are ignored."""

    @abstractmethod
    def next_deadline(self) -> float | None:
        """time.monotonic() at which ``step`` should run; None when idle (waiting for input)."""

    @abstractmethod
    def step(self) -> list[Output]: ...

    @abstractmethod
    def queue_depth(self) -> int:
        """Requests waiting in or running on this stage."""


class RequestPreprocessor(StageExecutor, Generic[In]):
    """A stage that turns each request into one final payload, one request per step in arrival
    order (preprocessing). Subclasses implement ``prepare``; a ``ValueError`` from it refuses the
    request (INVALID) with its message. What it prepares is the request's own input
    (``RequestInput``) unless a subclass takes another stage's payload."""

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.pending: list[tuple[str, RequestMeta, In]] = []

    @abstractmethod
    def prepare(self, request: In) -> Any:
        """The request's typed payload for the stages after this one."""

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        self.pending.append((rid, meta, inputs[REQUEST_INPUT]))

    def abort(self, rid: str) -> None:
        self.pending = [p for p in self.pending if p[0] != rid]

    def next_deadline(self) -> float | None:
        return 0.0 if self.pending else None

    def queue_depth(self) -> int:
        return len(self.pending)

    def step(self) -> list[Output]:
        rid, _meta, request = self.pending.pop(0)
        try:
            return [(FINAL, rid, self.prepare(request))]
        except ValueError as exc:
            return [(INVALID, rid, str(exc))]


class BatchQueue:
    """FIFO of ready items with a batching window: run when full or when the oldest waited long
    enough (encoders, vocoders)."""

    def __init__(self, max_batch_size: int, window_ms: float) -> None:
        self.max_batch_size = max_batch_size
        self.window = window_ms / 1000.0
        self.items: list[tuple[float, str, tuple[Any, int]]] = []  # (enqueued, rid, (item, weight))

    def put(self, rid: str, item: Any, weight: int = 1) -> None:
        self.items.append((time.monotonic(), rid, (item, weight)))

    def drop(self, rid: str) -> None:
        self.items = [it for it in self.items if it[1] != rid]

    def deadline(self) -> float | None:
        if not self.items:
            return None
        if sum(w for _, _, (_, w) in self.items) >= self.max_batch_size:
            return time.monotonic()
        return self.items[0][0] + self.window

    def take(self) -> list[tuple[str, Any]]:
        """The next batch: items in order until their weights reach max_batch_size (>= 1 item)."""
        batch: list[tuple[str, Any]] = []
        total = 0
        while self.items:
            _, rid, (item, w) = self.items[0]
            if batch and total + w > self.max_batch_size:
                break
            self.items.pop(0)
            batch.append((rid, item))
            total += w
        return batch

    def __len__(self) -> int:
        return len(self.items)


def reply_budget(engine: Any, asked: int | None, prompt_len: int) -> int:
    """The most tokens a reply may have: what the request asks, within the stage's
    ``max_new_tokens`` and what its context leaves after the prompt (at least one)."""
    limit = engine.max_new_tokens if asked is None else asked
    return max(1, min(limit, engine.max_new_tokens, engine.context_length - prompt_len))


def check_prompt(n: int, context_length: int, kv_tokens: int) -> None:
    """ValueError (a 400 ``context_length_exceeded``) for a prompt of ``n`` tokens that
    could never run: over the context, or over the plan's KV pool (``kv_tokens``; 0: none)."""
    if n >= context_length:
        raise ValueError(f"prompt of {n} tokens exceeds the context length {context_length}")
    if kv_tokens and n >= kv_tokens:
        raise ValueError(
            f"prompt of {n} tokens exceeds the context length {kv_tokens} that this stage's "
            "KV pool holds"
        )
