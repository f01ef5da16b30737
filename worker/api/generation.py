"""Consuming ``Engine.generate``: the iterator is always closed on exit, so a cancelled
consumer (client disconnect) aborts the request in every stage."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request

from worker.api.common import until_disconnect
from worker.contract.pipeline import (
    AUDIO_OUTPUT_RATE,
    AudioChunk,
    ClipStart,
    Event,
    Finished,
    GenerationRequest,
    TextDelta,
    TokenLogprob,
    WordTimings,
)
from worker.service import Ticket, WorkerService


@contextlib.asynccontextmanager
async def events(
    service: WorkerService, request: GenerationRequest
) -> AsyncIterator[AsyncIterator[Event]]:
    stream = service.pipeline.generate(request)
    try:
        yield stream
    finally:
        closer = getattr(stream, "aclose", None)
        if closer is not None:
            await closer()


@contextlib.asynccontextmanager
async def merged_events(
    service: WorkerService, requests: list[GenerationRequest]
) -> AsyncIterator[AsyncIterator[tuple[int, Event]]]:
    """The events of several requests (a chat's ``n`` choices) as they come, each with the
    index of its request; leaving the block ends every request still running."""
    if len(requests) == 1:  # the usual request: its own stream, no task between
        async with events(service, requests[0]) as stream:

            async def only() -> AsyncIterator[tuple[int, Event]]:
                async for event in stream:
                    yield 0, event

            yield only()
        return
    queue: asyncio.Queue[tuple[int, Event | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, request: GenerationRequest) -> None:
        try:
            async with events(service, request) as stream:
                async for event in stream:
                    await queue.put((index, event))
        except Exception as exc:  # the stream's failure, re-raised to the reader
            await queue.put((index, exc))
        else:
            await queue.put((index, None))

    tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(requests)]

    async def merged() -> AsyncIterator[tuple[int, Event]]:
        left = len(tasks)
        while left:
            index, item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item

    try:
        yield merged()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class Collected:
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # when the request asked
    pcm16: bytearray = field(default_factory=bytearray)
    clips: list[ClipStart] = field(default_factory=list)  # a transcription's, each before its text
    words: list[tuple[str, float, float]] = field(default_factory=list)  # word timestamps
    finished: Finished | None = None

    @property
    def finish_reason(self) -> str:
        return self.finished.finish_reason if self.finished else "stop"


async def collect(service: WorkerService, request: GenerationRequest, ticket: Ticket) -> Collected:
    out = Collected()
    async with events(service, request) as stream:
        async for event in stream:
            if isinstance(event, TextDelta):
                ticket.text()
                out.text.append(event.text)
                out.logprobs += event.logprobs or ()
            elif isinstance(event, AudioChunk):
                ticket.audio(len(event.pcm16))
                out.pcm16 += event.pcm16
            elif isinstance(event, ClipStart):
                out.clips.append(event)
            elif isinstance(event, WordTimings):
                out.words += event.words
            elif isinstance(event, Finished):
                out.finished = event
    service.metrics.tokens_out.inc(out.finished.completion_tokens if out.finished else 0)
    service.metrics.audio_out.inc(len(out.pcm16) / 2 / AUDIO_OUTPUT_RATE)
    return out


async def collect_whole(
    request: Request, service: WorkerService, gen: GenerationRequest, ticket: Ticket
) -> Collected | None:
    """One request's whole result, its ticket released after; None if the client left."""
    try:
        return await until_disconnect(request, collect(service, gen, ticket))
    finally:
        ticket.release()
