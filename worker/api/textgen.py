"""What chat completions and text completions share: the sampling fields as the thinker takes
them, stop texts, one request per choice, whole results or an SSE reply, and usage."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import orjson
from fastapi import Request
from starlette.requests import HTTPConnection

from fleet.errors import ErrorCode, OmniError
from worker.api.common import TrackedStream, until_disconnect
from worker.api.generation import Collected, collect
from worker.api.replay import default_seed
from worker.api.schemas import TextGeneration
from worker.contract.pipeline import Finished, GenerationRequest
from worker.contract.sampling import Sampling
from worker.service import Ticket, WorkerService


def bad(message: str, param: str) -> OmniError:
    return OmniError(400, ErrorCode.INVALID_REQUEST, message, param)


def refuse_unserved(body: TextGeneration) -> None:
    """Fields of OpenAI's that this worker does not serve, refused (400) rather than dropped."""
    if body.store:
        raise bad("store: true is not served (this worker keeps no completions)", "store")
    if body.metadata is not None:
        raise bad(
            "metadata is kept only with a stored completion (store), which this worker does "
            "not keep",
            "metadata",
        )
    if body.stream_options is not None and not body.stream:
        raise bad("stream_options needs stream: true", "stream_options")


def sampling_of(request: HTTPConnection, body: TextGeneration) -> Sampling:
    """How the thinker picks tokens: every sampling field of the body (a sampled request
    without a seed gets one derived from the router's request id: worker.api.replay)."""
    return Sampling(
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        seed=default_seed(request, body.seed),
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        logit_bias=_logit_bias(body.logit_bias),
    )


def _logit_bias(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: token ids (as strings) -> -100..100, added to their logits."""
    out = []
    for key, value in (bias or {}).items():
        if not key.isdigit() or not -100 <= value <= 100:
            raise bad("logit_bias maps token ids to values from -100 to 100", "logit_bias")
        out.append((int(key), float(value)))
    return tuple(out)


def stops(stop: str | list[str] | None) -> tuple[str, ...]:
    given = [stop] if isinstance(stop, str) else list(stop or [])
    for s in given:
        if not s or len(s) > 256:
            raise bad("each stop text must be 1-256 characters", "stop")
    return tuple(given)


def choices(gen: GenerationRequest, n: int) -> list[GenerationRequest]:
    """``n`` requests for ``n`` choices: the same prompt, each its own draws (choice i seeded
    with ``seed + i`` when the request has a seed, so the set is reproducible)."""
    if n == 1 or gen.sampling is None:
        return [gen] * n
    seed = gen.sampling.seed
    return [
        dataclasses.replace(
            gen,
            sampling=dataclasses.replace(gen.sampling, seed=None if seed is None else seed + i),
        )
        for i in range(n)
    ]


def usage(prompts: list[Finished], every: list[Finished]) -> dict:
    """Each prompt once (the first choice's count of each), the completions of every choice
    together (as OpenAI counts ``n``)."""
    prompt = sum(f.prompt_tokens for f in prompts)
    completion = sum(f.completion_tokens for f in every)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(f.cached_tokens for f in prompts)},
    }


def event_stream(events: AsyncIterator[bytes], ticket: Ticket) -> TrackedStream:
    """An SSE reply; its ticket is released however the stream ends."""
    return TrackedStream(
        events,
        ticket,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def collect_all(
    request: Request, service: WorkerService, gens: list[GenerationRequest], ticket: Ticket
) -> list[Collected] | None:
    """Every choice's whole result, the ticket released after; None if the client left."""
    try:
        return await until_disconnect(
            request, asyncio.gather(*(collect(service, g, ticket) for g in gens))
        )
    finally:
        ticket.release()


def sse(data: dict | str) -> bytes:
    payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
    return b"data: " + payload + b"\n\n"
