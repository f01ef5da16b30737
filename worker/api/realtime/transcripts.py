"""Input audio transcription (``session.audio.input.transcription`` set): each committed user
audio item is also transcribed by the served model (``RequestKind.TRANSCRIPTION``), beside
the response, and the client gets ``conversation.item.input_audio_transcription.delta`` as the
decoder writes, then ``.completed`` (or ``.failed``); the item keeps the transcript, in Redis
too.

A session's segments are one stream of speech: they are transcribed in the order they were
committed, each with the session's ``language`` hint (ISO-639-1, given to the model by its
name) and, as its ``prompt`` (the model's own context: Qwen3-ASR's system turn, Qwen3-Omni's
system message), the session's ``prompt`` followed by the text of the segments before it (its
last ``CONTEXT_CHARS``), so names, spellings and the sentence under way carry across the cuts
that turn detection makes."""

from __future__ import annotations

import asyncio
import contextlib

from fleet.errors import OmniError
from worker.api import languages
from worker.api.errors import stage_error
from worker.api.generation import events
from worker.api.realtime.conversation import new_id
from worker.api.realtime.errors import RealtimeError
from worker.api.realtime.response import Channel, SessionClosed
from worker.contract.options import TranscriptionOptions
from worker.contract.pipeline import (
    ClipStart,
    Finished,
    GenerationRequest,
    RequestKind,
    StageFailed,
    TextDelta,
)

CONTEXT_CHARS = 1_000  # of the session's earlier text, what a segment is transcribed after


def transcription_options(
    config: dict, earlier: list[str], detected: str | None = None
) -> TranscriptionOptions:
    """A segment's options from the session's ``transcription`` settings (``model`` is any
    name: the served model transcribes), the transcripts of the segments before it and the
    language the model detected in them (kept when the session names none)."""
    before = " ".join(t.strip() for t in earlier if t.strip())[-CONTEXT_CHARS:]
    keywords = config.get("keywords")
    listed = "Keywords: " + ", ".join(k.strip() for k in keywords) + "." if keywords else None
    prompt = "\n".join(p for p in (config.get("prompt"), listed, before) if p)
    given = config.get("language") or (config.get("languages") or [None])[0]
    language = languages.hint(given) if given else detected
    return TranscriptionOptions(language=language, prompt=prompt or None)


async def transcribe(
    channel: Channel, item: dict, options: TranscriptionOptions, content_index: int = 0
) -> tuple[str, str] | None:
    """Transcribe ``item``, its deltas sent as they come: its transcript and the language the
    model wrote for it (Qwen3-ASR's; "" from a model that writes none), or None: it failed."""
    item_id = item["id"]
    where = {"item_id": item_id, "content_index": content_index}
    service = channel.service
    text: list[str] = []
    language = ""
    finished: Finished | None = None
    try:
        try:
            ticket = service.admit(channel.session_id, RequestKind.TRANSCRIPTION)
        except OmniError as exc:
            raise RealtimeError.from_omni(exc) from exc
        try:
            audio = item["content"][content_index]["audio"]
            request = GenerationRequest(
                request_id=new_id("transcribe"),
                kind=RequestKind.TRANSCRIPTION,
                audio=channel.conversation.clip(item_id, audio),
                transcription=options,
                session_id=channel.session_id,
            )
            async with events(service, request) as stream:
                async for event in stream:
                    if isinstance(event, TextDelta) and event.text:
                        ticket.text()
                        text.append(event.text)
                        with contextlib.suppress(SessionClosed):
                            await channel.send(
                                {
                                    "type": "conversation.item.input_audio_transcription.delta",
                                    **where,
                                    "delta": event.text,
                                }
                            )
                    elif isinstance(event, ClipStart):
                        language = event.language or language
                    elif isinstance(event, Finished):
                        finished = event
        except StageFailed as exc:
            status, code, message, param = stage_error(exc)
            raise RealtimeError(code, message, param, status) from exc
        finally:
            ticket.release()
    except RealtimeError as exc:
        error = exc.event()["error"]
        with contextlib.suppress(SessionClosed):
            await channel.send(
                {
                    "type": "conversation.item.input_audio_transcription.failed",
                    **where,
                    "error": error,
                }
            )
        return None
    transcript = "".join(text)
    service.metrics.tokens_out.inc(finished.completion_tokens if finished else 0)
    with contextlib.suppress(RealtimeError):  # the item was deleted meanwhile
        await channel.conversation.set_transcript(item_id, content_index, transcript)
    tokens_in = finished.prompt_tokens if finished else 0
    tokens_out = finished.completion_tokens if finished else 0
    usage = {
        "type": "tokens",
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "total_tokens": tokens_in + tokens_out,
    }
    with contextlib.suppress(SessionClosed):
        await channel.send(
            {
                "type": "conversation.item.input_audio_transcription.completed",
                **where,
                "transcript": transcript,
                "usage": usage,
            }
        )
    return transcript, language


class Transcriber:
    """A session's transcriptions, one after another in commit order, each after the text of
    the ones before; ``stop`` cancels those in flight (their requests abort)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.tasks: set[asyncio.Task] = set()
        self.heard: list[str] = []  # the session's transcripts so far, in order
        # the first language the model detected that the API knows (worker.api.languages):
        # the next segments' hint, where the session names none
        self.language: str | None = None
        self.last: asyncio.Task | None = None

    def start(self, item: dict, config: dict) -> None:
        """Transcribe ``item`` with the session's transcription ``config``, as it is now,
        once the segments committed before it are done."""
        before = self.last

        async def in_turn() -> None:
            if before is not None:
                await asyncio.wait({before})  # (its failure or cancellation is its own)
            options = transcription_options(config, self.heard, self.language)
            heard = await transcribe(self.channel, item, options)
            if heard is not None:
                transcript, language = heard
                if self.language is None and languages.codes_of([language]):
                    self.language = language
                self.heard.append(transcript)
                # (only the last CONTEXT_CHARS are ever read: a long session keeps no more)
                while len(self.heard) > 1 and sum(map(len, self.heard[1:])) >= CONTEXT_CHARS:
                    self.heard.pop(0)

        task = asyncio.create_task(in_turn(), name=f"transcribe-{item['id']}")
        self.last = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def stop(self) -> None:
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
