"""One response: drives ``Engine.generate`` and streams its text and audio as Realtime events.

With tools (text output), the reply's function calls are taken out of its text as chat takes
them (``worker.api.tools.Calls``) and follow its message as ``function_call`` items, each with
``response.function_call_arguments.delta`` / ``.done``; a forced call (``required``, a named
function: held to the schema by the grammar) is the response's only item.

Cancelling the response's task (``response.cancel``, barge-in, the session closing) closes the
engine iterator, which aborts the request in every stage at once; the reply then keeps what was
sent of it (its transcript cut to the audio sent) and ``response.done`` says ``cancelled``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from fleet.errors import ErrorCode, OmniError
from worker.api.errors import stage_error
from worker.api.generation import events
from worker.api.realtime import g711
from worker.api.realtime.config import PCM_RATE, format_view
from worker.api.realtime.conversation import (
    Conversation,
    function_call_item,
    message_item,
    new_id,
    public,
    without_oldest_turns,
)
from worker.api.realtime.conversation import spoken_text as spoken_part
from worker.api.realtime.errors import RealtimeError
from worker.api.streamed_text import StreamedText
from worker.api.tools import Calls, ToolUse
from worker.contract.pipeline import (
    AudioChunk,
    Finished,
    GenerationRequest,
    RequestInvalid,
    StageFailed,
)
from worker.contract.pipeline import TextDelta as EngineText
from worker.service import Ticket, WorkerService

log = logging.getLogger(__name__)

PCM_BYTES_PER_SECOND = PCM_RATE * 2


class SessionClosed(Exception):
    """The client is gone: nothing more can be sent."""


class Channel(Protocol):
    """What a response needs from its session."""

    service: WorkerService
    conversation: Conversation
    session_id: str
    response: Response | None  # the one in flight; a response clears itself when done

    async def send(self, event: dict) -> None:
        """Raises ``SessionClosed`` once the client is gone."""

    async def send_error(self, error: RealtimeError) -> None:
        """An ``error`` event, counted; never raises."""

    async def response_ended(self, response: Response) -> None:
        """The response ended on this worker: it is not to be run again on a resume."""


@dataclass
class ResponsePlan:
    """A ``response.create`` resolved against the session's settings (``planning``)."""

    request: GenerationRequest  # its request and session ids are the response's
    modalities: list[str]
    voice: str | None = None
    max_tokens: int | None = None
    in_conversation: bool = True  # conversation "none": an out-of-band reply, not stored
    metadata: dict | None = None
    spoken: str | None = None  # text-to-speech: the text the audio says, known at the start
    text_in: StreamedText | None = None  # text-to-speech: more text to say as it is written
    output_format: str = g711.PCM
    tools: ToolUse | None = None  # function calling (not "none"): calls become items


@dataclass
class Response:
    channel: Channel
    plan: ResponsePlan
    id: str = field(default_factory=lambda: new_id("resp"))
    item_id: str = field(default_factory=lambda: new_id("item"))
    text: list[str] = field(default_factory=list)
    audio_bytes: int = 0
    status: str = "in_progress"
    reason: str | None = None
    error: RealtimeError | None = None
    usage: Finished | None = None
    task: asyncio.Task | None = None
    running: bool = False  # the task has begun (a task cancelled before that never runs)
    cancelling: bool = False
    calls: Calls | None = None  # with tools: what takes the calls out of the reply's text

    def __post_init__(self) -> None:
        if self.plan.tools is not None:
            self.calls = Calls(self.plan.tools, lambda _k: new_id("call"))

    @property
    def has_message(self) -> bool:
        """A forced call is the reply: no message item (its text is the call)."""
        return self.calls is None or not self.calls.use.constrained

    @property
    def audio(self) -> bool:
        return "audio" in self.plan.modalities

    def start(self) -> asyncio.Task:
        self.task = asyncio.create_task(self._run(), name=f"realtime-{self.id}")
        return self.task

    async def cancel(self, reason: str) -> None:
        """Stop now (idempotent); returns once ``response.done`` went out."""
        if self.task is None or self.task.done():
            return
        if not self.cancelling:  # once: a second cancel must not cut response.done short
            self.cancelling, self.reason = True, reason
            if self.running:
                self.task.cancel()
        await asyncio.wait({self.task})  # the caller's own cancellation still propagates

    # -- events ------------------------------------------------------------------------------

    def _part(self, final: bool) -> dict:
        said = "".join(self.text)
        if self.audio:
            return {"type": "audio", "transcript": said if final else ""}
        return {"type": "text", "text": said if final else ""}

    def _item(self, status: str) -> dict:
        said = "".join(self.text)
        if self.audio:
            content = [{"type": "output_audio", "transcript": said}]
        else:
            content = [{"type": "output_text", "text": said}]
        item = message_item("assistant", content, self.item_id, status)
        if self.audio:
            item["_audio_ms"] = self.audio_bytes * 1000 // PCM_BYTES_PER_SECOND
        return item

    def _response(self, output: list[dict]) -> dict:
        body: dict = {
            "id": self.id,
            "object": "realtime.response",
            "status": self.status,
            "status_details": None,
            "output": output,
            "conversation_id": self.channel.session_id if self.plan.in_conversation else None,
            "output_modalities": self.plan.modalities,
            "audio": {
                "output": {"format": format_view(self.plan.output_format), "voice": self.plan.voice}
            },
            "max_output_tokens": self.plan.max_tokens or "inf",
            "metadata": self.plan.metadata,
            "usage": None,
        }
        if self.status != "in_progress":
            details: dict = {"type": self.status}
            if self.reason:
                details["reason"] = self.reason
            if self.error is not None:
                details["error"] = self.error.event()["error"]
            body["status_details"] = details
        if self.usage is not None:
            u = self.usage
            body["usage"] = {
                "total_tokens": u.prompt_tokens + u.completion_tokens,
                "input_tokens": u.prompt_tokens,
                "output_tokens": u.completion_tokens,
                "input_token_details": {
                    "text_tokens": u.prompt_tokens,
                    "audio_tokens": 0,
                    "cached_tokens": u.cached_tokens,
                },
                "output_token_details": {
                    "text_tokens": u.completion_tokens,
                    "audio_tokens": 0,
                },
            }
        return body

    def _where(self) -> dict:
        return {"response_id": self.id, "item_id": self.item_id, "output_index": 0}

    # -- the run -----------------------------------------------------------------------------

    async def _run(self) -> None:
        ch = self.channel
        send = ch.send
        ticket = None
        started = False
        self.running = True
        try:
            if self.cancelling:  # cancelled before it began
                raise asyncio.CancelledError
            await send({"type": "response.created", "response": self._response([])})
            try:
                request = self.plan.request
                ticket = ch.service.admit(
                    ch.session_id, request.kind, output_audio=request.output_audio
                )
            except OmniError as exc:
                raise RealtimeError.from_omni(exc) from exc
            where = {**self._where(), "content_index": 0}
            if self.has_message:
                previous = None
                if self.plan.in_conversation:
                    previous = await ch.conversation.add(self._item("in_progress"), store=False)
                started = True
                item = public(self._item("in_progress")) | {"content": []}
                await send({"type": "response.output_item.added", **self._where(), "item": item})
                if self.plan.in_conversation:
                    await send(
                        {"type": "conversation.item.added", "previous_item_id": previous,
                         "item": item}
                    )  # fmt: skip
                await send(
                    {"type": "response.content_part.added", **where, "part": self._part(False)}
                )
            text_event = (
                "response.output_audio_transcript.delta"
                if self.audio
                else "response.output_text.delta"
            )
            request.request_id, request.session_id = self.id, ch.session_id
            if self.plan.spoken is not None:
                self.text.append(self.plan.spoken)
                await send({"type": text_event, **where, "delta": self.plan.spoken})
            if self.plan.text_in is not None:
                request.text_stream = self._transcribed(self.plan.text_in, where)
            while True:
                try:
                    await self._stream(request, ticket, where, text_event)
                    break
                except RequestInvalid as exc:
                    # Over the model's context: the oldest turns stay in the conversation but
                    # leave the prompt (OpenAI's truncation "auto"), while nothing was sent.
                    shorter = without_oldest_turns(request.messages)
                    overflow = stage_error(exc)[1] == ErrorCode.CONTEXT_LENGTH_EXCEEDED
                    if not overflow or shorter is None or self.text or self.audio_bytes:
                        raise
                    request.messages = shorter
            if self.calls is not None:
                rest, _ = self.calls.finish()
                if rest and self.has_message:
                    self.text.append(rest)
                    await send({"type": text_event, **where, "delta": rest})
            ch.service.metrics.tokens_out.inc(self.usage.completion_tokens if self.usage else 0)
            ch.service.metrics.audio_out.inc(self.audio_bytes / PCM_BYTES_PER_SECOND)
            self.status = "completed"
            if self.usage is not None and self.usage.finish_reason == "length":
                self.status, self.reason = "incomplete", "max_output_tokens"
            if self.has_message:
                await self._message_done(where)
        except asyncio.CancelledError:
            self.status = "cancelled"
            self.reason = self.reason or "client_cancelled"
            ch.service.metrics.aborted.inc()
            self._keep_what_was_said()
        except SessionClosed:
            self.status, self.reason = "cancelled", "client_cancelled"
            ch.service.metrics.aborted.inc()
            self._keep_what_was_said()
        except RealtimeError as exc:
            self.status, self.error = "failed", exc
        except StageFailed as exc:
            status, code, message, param = stage_error(exc)
            self.status, self.error = "failed", RealtimeError(code, message, param, status)
        except BaseException:
            if ticket is not None:
                ticket.release()
            raise
        try:
            await self._finish(started)
        finally:
            # in flight until its client was told: a drain waits for the response.done too
            if ticket is not None:
                ticket.release()

    async def _message_done(self, where: dict) -> None:
        send, said = self.channel.send, "".join(self.text)
        if self.audio:
            await send({"type": "response.output_audio.done", **where})
            await send(
                {"type": "response.output_audio_transcript.done", **where, "transcript": said}
            )
        else:
            await send({"type": "response.output_text.done", **where, "text": said})
        await send({"type": "response.content_part.done", **where, "part": self._part(True)})

    async def _stream(
        self, request: GenerationRequest, ticket: Ticket, where: dict, text_event: str
    ) -> None:
        send = self.channel.send
        async with events(self.channel.service, request) as stream:
            async for event in stream:
                if isinstance(event, EngineText):
                    ticket.text()
                    text = event.text
                    if self.calls is not None:  # (the calls it completes follow the message)
                        text, _ = self.calls.feed(text)
                    if text:
                        self.text.append(text)
                        await send({"type": text_event, **where, "delta": text})
                elif isinstance(event, AudioChunk):
                    ticket.audio(len(event.pcm16))
                    wire = g711.from_pcm(self.plan.output_format, event.pcm16)
                    data = base64.b64encode(wire).decode()
                    await send({"type": "response.output_audio.delta", **where, "delta": data})
                    self.audio_bytes += len(event.pcm16)
                elif isinstance(event, Finished):
                    self.usage = event

    async def _transcribed(self, text: StreamedText, where: dict) -> AsyncIterator[str]:
        """A streamed text's pieces to the engine, each one first in the transcript: the
        client sees the words as the talker gets them, after the events that open the reply."""
        async for piece in text.pieces():
            self.text.append(piece)
            with contextlib.suppress(SessionClosed):  # (the session's close cancels the reply)
                await self.channel.send(
                    {"type": "response.output_audio_transcript.delta", **where, "delta": piece}
                )
            yield piece

    def _keep_what_was_said(self) -> None:
        """An interrupted reply keeps the words its sent audio said (its text: what was sent)."""
        if self.audio:
            said = spoken_part("".join(self.text), self.audio_bytes / PCM_BYTES_PER_SECOND, None)
            self.text = [said]

    async def _finish(self, started: bool) -> None:
        ch = self.channel
        if ch.response is self:  # a client answering response.done may create the next one
            ch.response = None
        item: dict | None = None
        if started:
            # stored first: the reply outlives a client that is gone (a resume sees it)
            item = self._item("completed" if self.status == "completed" else "incomplete")
            if self.plan.in_conversation:
                with contextlib.suppress(RealtimeError):  # deleted by the client meanwhile
                    ch.conversation.items[ch.conversation.index(self.item_id)] = item
                    await ch.conversation.store_item(item)
        calls: list[tuple[dict, str | None]] = []  # each call item, and the item before it
        if self.calls is not None and self.status == "completed":
            previous = item["id"] if item is not None else None
            for call in self.calls.calls:
                f = call["function"]
                call_item = function_call_item(call["id"], f["name"], f["arguments"])
                if self.plan.in_conversation:  # (stored, as the message: before it is sent)
                    previous = await ch.conversation.add(call_item)
                calls.append((call_item, previous))
                previous = call_item["id"]
        await ch.response_ended(self)
        with contextlib.suppress(SessionClosed):
            if self.error is not None:
                await ch.send_error(self.error)
            output: list[dict] = []
            if item is not None:
                shown = public(item)
                output = [shown]
                await ch.send({"type": "response.output_item.done", **self._where(), "item": shown})
                if self.plan.in_conversation:
                    await ch.send({"type": "conversation.item.done", "item": shown})
            for call_item, previous in calls:
                await self._send_call(call_item, len(output), previous)
                output.append(public(call_item))
            await ch.send({"type": "response.done", "response": self._response(output)})

    async def _send_call(self, item: dict, index: int, previous_id: str | None) -> None:
        """One function call item's events, its arguments in one delta (the call is parsed
        whole: a forced call's JSON, or a ``<tool_call>`` block once it closed)."""
        send = self.channel.send
        where = {"response_id": self.id, "item_id": item["id"], "output_index": index}
        shown = public(item)
        await send(
            {"type": "response.output_item.added", "response_id": self.id, "output_index": index,
             "item": shown | {"status": "in_progress", "arguments": ""}}
        )  # fmt: skip
        if self.plan.in_conversation:
            await send(
                {"type": "conversation.item.added", "previous_item_id": previous_id, "item": shown}
            )
        call = {"call_id": item["call_id"]}
        await send(
            {"type": "response.function_call_arguments.delta", **where, **call,
             "delta": item["arguments"]}
        )  # fmt: skip
        await send(
            {"type": "response.function_call_arguments.done", **where, **call,
             "name": item["name"], "arguments": item["arguments"]}
        )  # fmt: skip
        await send(
            {"type": "response.output_item.done", "response_id": self.id, "output_index": index,
             "item": shown}
        )  # fmt: skip
        if self.plan.in_conversation:
            await send({"type": "conversation.item.done", "item": shown})
