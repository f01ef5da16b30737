"""Input audio transcription (``session.audio.input.transcription`` set): each committed user
audio item is also transcribed by the served model (``RequestKind.TRANSCRIPTION``), beside
the response, with the session's ``language`` hint and ``prompt`` (as
``/v1/audio/transcriptions`` takes them), and the client gets
``conversation.item.input_audio_transcription.completed`` (or ``.failed``); the item keeps the
transcript, in Redis too."""

from __future__ import annotations

import asyncio
import contextlib

from fleet.errors import OmniError
from worker.api.errors import stage_error
from worker.api.generation import collect
from worker.api.realtime.conversation import new_id
from worker.api.realtime.errors import RealtimeError
from worker.api.realtime.response import Channel, SessionClosed
from worker.contract.options import TranscriptionOptions
from worker.contract.pipeline import GenerationRequest, RequestKind, StageFailed


def transcription_options(config: dict) -> TranscriptionOptions:
    """The session's ``transcription`` settings as the pipeline's options (``model`` is any
    name: the served model transcribes)."""
    return TranscriptionOptions(
        language=config.get("language") or None, prompt=config.get("prompt") or None
    )


async def transcribe(
    channel: Channel, item: dict, options: TranscriptionOptions, content_index: int = 0
) -> None:
    item_id = item["id"]
    where = {"item_id": item_id, "content_index": content_index}
    service = channel.service
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
            result = await collect(service, request, ticket)
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
        return
    transcript = "".join(result.text)
    with contextlib.suppress(RealtimeError):  # the item was deleted meanwhile
        await channel.conversation.set_transcript(item_id, content_index, transcript)
    finished = result.finished
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


class Transcriber:
    """A session's transcriptions in flight; ``stop`` cancels them (their requests abort)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.tasks: set[asyncio.Task] = set()

    def start(self, item: dict, config: dict) -> None:
        """Transcribe ``item`` with the session's transcription ``config``, as it is now."""
        task = asyncio.create_task(
            transcribe(self.channel, item, transcription_options(config)),
            name=f"transcribe-{item['id']}",
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def stop(self) -> None:
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
