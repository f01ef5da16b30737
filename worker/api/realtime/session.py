"""One realtime session: its settings, input audio buffer, turn detection, conversation and the
response in flight; each client event handled in order. Sends go through one lock, so events
of a response and of the client's own requests never interleave mid-message."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson
import redis.exceptions

from fleet.conversations import ConversationStore
from fleet.errors import OmniError
from fleet.records import Endpoint, Modality
from worker.api.limits import max_prompt_bytes
from worker.api.realtime import config as cfg
from worker.api.realtime import events as ev
from worker.api.realtime.conversation import (
    Conversation,
    check_text,
    item_from_client,
    message_item,
    new_id,
    public,
)
from worker.api.realtime.dialect import to_beta
from worker.api.realtime.errors import Code, RealtimeError
from worker.api.realtime.input_audio import InputAudioBuffer, decode_input, ms
from worker.api.realtime.metrics import RealtimeMetrics
from worker.api.realtime.planning import plan_response, speaks_only, tool_use
from worker.api.realtime.response import Response, SessionClosed
from worker.api.realtime.transcripts import Transcriber
from worker.api.realtime.turns import ServerVad, SpeechStarted, SpeechStopped, smart_turn
from worker.api.streamed_text import StreamedText
from worker.api.voices import resolve_voice
from worker.service import WorkerService

log = logging.getLogger(__name__)

Sender = Callable[[str], Awaitable[None]]


class RealtimeSession:
    def __init__(
        self,
        service: WorkerService,
        session_id: str,
        model: str,
        send_text: Sender,
        *,
        beta: bool = False,
        store: ConversationStore | None = None,
        stored_name: str | None = None,
        transcription_only: bool = False,
    ) -> None:
        """``transcription_only``: OpenAI's transcription session (``?intent=transcription``):
        committed audio is transcribed as it comes, and nothing answers it."""
        self.service = service
        self.session_id = session_id
        self.model = model
        self.beta = beta
        self._send_text = send_text
        self._lock = asyncio.Lock()
        self.metrics = RealtimeMetrics(service.metrics)
        self.closed = False
        settings = service.settings
        self.store = store
        self.stored_name = stored_name or session_id
        self.config = cfg.SessionConfig()
        if Modality.AUDIO not in service.capabilities.output_modalities:
            self.config.output_modalities = ["text"]
        self.hears = Modality.AUDIO in service.capabilities.input_modalities
        self.transcribes = Endpoint.TRANSCRIPTION in service.capabilities.endpoints
        if not self.hears:  # text-to-speech: no audio comes in, so no turns to detect
            self.config.turn_detection = None
        speakers = service.pipeline.speakers()
        self.config.voice = speakers[0] if speakers else None  # a built-in: nothing to fetch
        if transcription_only:
            self.config = cfg.SessionConfig(
                type=cfg.TRANSCRIPTION, output_modalities=["text"], transcription={"model": model}
            )
        self.voice_audio: np.ndarray | None = None
        self.buffer = InputAudioBuffer(settings.realtime_max_buffer_seconds)
        self.max_text_bytes = max_prompt_bytes(settings, service.spec)
        self.conversation = Conversation(store, self.stored_name, settings.realtime_max_items)
        self.vad: ServerVad | None = None
        self.turn_item_id: str | None = None  # the item the speech in progress will become
        self.turn_start = 0
        self.response: Response | None = None
        self.transcriber = Transcriber(self)

    # -- sending -----------------------------------------------------------------------------

    async def send(self, event: dict) -> None:
        if self.closed:
            raise SessionClosed
        stamped = {"event_id": new_id("event"), **event}
        shown = to_beta(stamped) if self.beta else stamped
        if shown is None:  # an event beta clients never get
            return
        data = orjson.dumps(shown).decode()
        async with self._lock:
            try:
                await self._send_text(data)
            except Exception as exc:  # the transport's own close and disconnect errors
                self.closed = True
                raise SessionClosed from exc

    async def send_error(self, error: RealtimeError, client_event_id: str | None = None) -> None:
        self.metrics.error(error.code.value)
        with contextlib.suppress(SessionClosed):
            await self.send(error.event(client_event_id))

    # -- life --------------------------------------------------------------------------------

    async def open(self) -> None:
        """Resume a stored conversation of this session id, then announce the session."""
        if self.store is not None:
            try:
                stored = await self.store.load(self.stored_name)
            except (redis.exceptions.RedisError, OSError) as exc:
                log.warning("conversation %s not loaded: %s", self.stored_name, exc)
            else:
                self.conversation.items = stored.items[-self.conversation.max_items :]
                if stored.config:
                    with contextlib.suppress(ValueError):
                        config = cfg.SessionConfig.model_validate(stored.config)
                        if config.type == self.config.type:  # (a session keeps its type)
                            self.config = config
                if stored.items or stored.config:
                    log.info(
                        "realtime session %s resumed: %d items", self.session_id, len(stored.items)
                    )
        if self.config.voice is not None:
            with contextlib.suppress(OmniError):
                _, self.voice_audio = await resolve_voice(self.service, self.config.voice, "voice")
        self._reset_vad()
        await self.send({"type": "session.created", "session": self.view()})
        await self._rerun_interrupted()

    async def _rerun_interrupted(self) -> None:
        """The response that was in flight when this session's last worker died runs again,
        whole, under the same response and item ids: the client gets the answer once (its
        partial events from before carry the same ids: they are replaced)."""
        if self.store is None:
            return
        try:
            pending = await self.store.take_pending(self.stored_name)
        except (redis.exceptions.RedisError, OSError) as exc:
            log.warning("conversation %s: pending response not read: %s", self.stored_name, exc)
            return
        if pending is None:
            return
        try:
            given = ev.ResponseIn.model_validate(pending["response"])
        except ValueError as exc:  # a note of another build: nothing to re-run
            log.warning("conversation %s: pending response dropped: %s", self.stored_name, exc)
            return
        log.info("realtime session %s: re-running response %s", self.session_id, pending["id"])
        try:
            await self._start_response(given, pending["id"], pending["item_id"])
        except RealtimeError as exc:  # (a voice deleted since, say): the client is told
            await self.send_error(exc)

    async def stop_response(self) -> None:
        """Stop the response and transcriptions in flight, if any: their stages abort."""
        if self.response is not None:
            await self.response.cancel("client_cancelled")
        await self.transcriber.stop()

    def view(self) -> dict:
        return cfg.session_view(self.config, self.session_id, self.model, self.beta)

    def _reset_vad(self) -> None:
        td = self.config.turn_detection
        self.vad = ServerVad(td, self.buffer.end) if td is not None else None
        self.turn_item_id = None
        if td is not None and td.eagerness is not None:
            # Smart Turn loads in a few seconds: now, beside the session, not at its first pause
            asyncio.get_running_loop().run_in_executor(None, smart_turn)

    # -- dispatch ----------------------------------------------------------------------------

    async def handle(self, event: ev.ClientEvent) -> None:
        if self.config.type == cfg.TRANSCRIPTION and event.type not in _TRANSCRIPTION_EVENTS:
            raise RealtimeError(
                Code.INVALID_REQUEST,
                f"{event.type} is not served in a transcription session: it takes audio "
                "(input_audio_buffer.*) and its settings (session.update) and answers with "
                "transcripts",
                "type",
            )
        handler = _HANDLERS[event.type]
        await handler(self, event)

    async def _session_update(self, event: ev.SessionUpdate) -> None:
        check_text(event.session.instructions or "", self.max_text_bytes, "session.instructions")
        if event.session.model is not None:
            try:
                self.service.check_model(event.session.model)
            except OmniError as exc:
                raise RealtimeError.from_omni(exc) from exc
        new, voice = cfg.apply(self.config, event.session)
        tool_use(new.tools, new.tool_choice, "session")  # (refused now, not at the next reply)
        if voice is not None and voice != self.config.voice:
            try:
                name, self.voice_audio = await resolve_voice(
                    self.service, voice, "session.audio.output.voice"
                )
            except OmniError as exc:
                raise RealtimeError.from_omni(exc) from exc
            new = new.model_copy(update={"voice": name})
        if new.transcription is not None and not self.transcribes:
            raise RealtimeError(
                Code.INVALID_REQUEST,
                f"model {self.model!r} does not transcribe",
                "session.audio.input.transcription",
            )
        turn_changed = new.turn_detection != self.config.turn_detection
        self.config = new
        if turn_changed:
            self._reset_vad()
        if self.store is not None:
            try:
                await self.store.save_config(self.stored_name, new.model_dump())
            except (redis.exceptions.RedisError, OSError) as exc:
                log.warning("session %s settings not stored: %s", self.stored_name, exc)
        await self.send({"type": "session.updated", "session": self.view()})

    async def _append(self, event: ev.AudioAppend) -> None:
        if not self.hears:
            raise RealtimeError(
                Code.INVALID_REQUEST, f"model {self.model!r} takes no audio input", "audio"
            )
        pcm = decode_input(event.audio, self.config.input_format)
        self.buffer.append(pcm)
        if self.vad is None:
            return
        for turn in await self.vad.feed(pcm):
            if isinstance(turn, SpeechStarted):
                await self._speech_started(turn)
            else:
                await self._speech_stopped(turn)
        if self.vad is not None and not self.vad.speaking:
            # no turn in progress: only the padding a turn would start with is worth keeping
            self.buffer.take(end=self.vad.position - self.vad.keep_samples)

    async def _speech_started(self, turn: SpeechStarted) -> None:
        assert self.vad is not None
        self.turn_item_id = new_id("item")
        self.turn_start = max(self.buffer.base, turn.at - self.vad.prefix_samples)
        await self.send(
            {
                "type": "input_audio_buffer.speech_started",
                "audio_start_ms": ms(self.turn_start),
                "item_id": self.turn_item_id,
            }
        )
        if self.response is not None and self.vad.config.interrupt_response:
            await self.response.cancel("turn_detected")  # barge-in

    async def _speech_stopped(self, turn: SpeechStopped) -> None:
        assert self.vad is not None
        item_id = self.turn_item_id or new_id("item")
        await self.send(
            {
                "type": "input_audio_buffer.speech_stopped",
                "audio_end_ms": ms(turn.at),
                "item_id": item_id,
            }
        )
        pcm = self.buffer.take(self.turn_start, turn.until)
        self.turn_item_id = None
        await self._commit(pcm, item_id)
        if (self.vad.config.create_response and self.response is None
                and self.config.type == cfg.REALTIME):  # fmt: skip
            await self._start_response(None)

    async def _commit(self, pcm: bytes, item_id: str | None = None) -> None:
        item = message_item(
            "user",
            [{"type": "input_audio", "audio": base64.b64encode(pcm).decode(), "transcript": None}],
            item_id,
        )
        previous = await self.conversation.add(item)
        await self.send(
            {
                "type": "input_audio_buffer.committed",
                "previous_item_id": previous,
                "item_id": item["id"],
            }
        )
        await self._announce(item, previous)
        if self.config.transcription is not None:
            self.transcriber.start(item, self.config.transcription)

    async def _announce(self, item: dict, previous: str | None) -> None:
        shown = public(item)
        await self.send(
            {"type": "conversation.item.added", "previous_item_id": previous, "item": shown}
        )
        await self.send(
            {"type": "conversation.item.done", "previous_item_id": previous, "item": shown}
        )

    async def _commit_buffer(self, event: ev.ClientEvent) -> None:
        if self.buffer.end == self.buffer.base:
            raise RealtimeError(
                Code.INPUT_AUDIO_BUFFER_COMMIT_EMPTY, "the input audio buffer is empty", None
            )
        pcm = self.buffer.take()
        item_id = self.turn_item_id
        self._reset_vad()
        await self._commit(pcm, item_id)

    async def _clear(self, event: ev.ClientEvent) -> None:
        self.buffer.clear()
        self._reset_vad()
        await self.send({"type": "input_audio_buffer.cleared"})

    async def _text_append(self, event: ev.TextAppend) -> None:
        """Text spoken as it is written (a text-to-speech model with a streaming-text mode):
        the first piece starts a response that speaks it, after what the conversation left
        unspoken; the next ones go on into it until ``input_text_buffer.commit``."""
        family = self.service.family
        if not speaks_only(self.service) or not family.streams_text:
            raise RealtimeError(
                Code.INVALID_REQUEST,
                f"model {self.model!r} takes no streamed text (a text-to-speech model with a "
                "streaming-text mode does): add a conversation item instead",
                "type",
            )
        response = self.response
        text = response.plan.text_in if response is not None else None
        if text is not None and not text.done:
            try:
                text.add(event.delta, "delta")
            except OmniError as exc:
                raise RealtimeError.from_omni(exc) from exc
            return
        if response is not None:
            raise RealtimeError(
                Code.ACTIVE_RESPONSE,
                f"response {response.id} is in progress; cancel it or wait for response.done",
            )
        try:
            text = StreamedText(event.delta, "delta")
        except OmniError as exc:
            raise RealtimeError.from_omni(exc) from exc
        await self._start_response(None, text_in=text)

    async def _text_commit(self, event: ev.ClientEvent) -> None:
        response = self.response
        text = response.plan.text_in if response is not None else None
        if response is None or text is None or text.done:
            raise RealtimeError(
                Code.INVALID_REQUEST,
                "no streamed text to commit: input_text_buffer.append starts one",
                "type",
            )
        text.end()
        await self.send({"type": "input_text_buffer.committed", "response_id": response.id})

    async def _item_create(self, event: ev.ItemCreate) -> None:
        item = item_from_client(
            event.item, self.buffer.max_bytes, self.max_text_bytes, self.config.input_format
        )
        previous = await self.conversation.add(item, event.previous_item_id)
        await self._announce(item, previous)

    async def _item_truncate(self, event: ev.ItemTruncate) -> None:
        await self.conversation.truncate(event.item_id, event.content_index, event.audio_end_ms)
        await self.send(
            {
                "type": "conversation.item.truncated",
                "item_id": event.item_id,
                "content_index": event.content_index,
                "audio_end_ms": event.audio_end_ms,
            }
        )

    async def _item_delete(self, event: ev.ItemRef) -> None:
        await self.conversation.delete(event.item_id)
        await self.send({"type": "conversation.item.deleted", "item_id": event.item_id})

    async def _item_retrieve(self, event: ev.ItemRef) -> None:
        item = self.conversation.get(event.item_id)
        shown = {k: v for k, v in item.items() if not k.startswith("_")}
        await self.send({"type": "conversation.item.retrieved", "item": shown})

    async def _response_create(self, event: ev.ResponseCreate) -> None:
        if self.response is not None:
            raise RealtimeError(
                Code.ACTIVE_RESPONSE,
                f"response {self.response.id} is in progress; cancel it or wait for response.done",
            )
        await self._start_response(event.response)

    async def _start_response(
        self,
        given: ev.ResponseIn | None,
        response_id: str = "",
        item_id: str = "",
        text_in: StreamedText | None = None,
    ) -> None:
        given = given or ev.ResponseIn()
        plan = await plan_response(self, given, text_in)
        response = Response(self, plan)
        if response_id:
            response.id, response.item_id = response_id, item_id
        self.response = response
        # re-run if this worker dies (not a streamed text: what came of it is gone)
        if self.store is not None and plan.in_conversation and text_in is None:
            note = {"id": response.id, "item_id": response.item_id,
                    "response": given.model_dump(mode="json", exclude_none=True)}  # fmt: skip
            try:
                await self.store.set_pending(self.stored_name, note)
            except (redis.exceptions.RedisError, OSError) as exc:
                log.warning("conversation %s: response not noted: %s", self.stored_name, exc)
        response.start()

    async def response_ended(self, response: Response) -> None:
        if self.store is None or not response.plan.in_conversation:
            return
        try:
            await self.store.clear_pending(self.stored_name)
        except (redis.exceptions.RedisError, OSError) as exc:
            log.warning("conversation %s: pending note kept: %s", self.stored_name, exc)

    async def _response_cancel(self, event: ev.ResponseCancel) -> None:
        response = self.response
        if response is None or (event.response_id and event.response_id != response.id):
            raise RealtimeError(
                Code.RESPONSE_CANCEL_NOT_ACTIVE, "no response in progress to cancel", "response_id"
            )
        await response.cancel("client_cancelled")


# each handler takes its own event model (``ev.EVENTS`` parses the type into it)
_HANDLERS: dict[str, Callable[[RealtimeSession, Any], Awaitable[None]]] = {
    "session.update": RealtimeSession._session_update,
    "input_audio_buffer.append": RealtimeSession._append,
    "input_audio_buffer.commit": RealtimeSession._commit_buffer,
    "input_audio_buffer.clear": RealtimeSession._clear,
    "input_text_buffer.append": RealtimeSession._text_append,
    "input_text_buffer.commit": RealtimeSession._text_commit,
    "conversation.item.create": RealtimeSession._item_create,
    "conversation.item.truncate": RealtimeSession._item_truncate,
    "conversation.item.delete": RealtimeSession._item_delete,
    "conversation.item.retrieve": RealtimeSession._item_retrieve,
    "response.create": RealtimeSession._response_create,
    "response.cancel": RealtimeSession._response_cancel,
}
_TRANSCRIPTION_EVENTS = frozenset({
    "session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
    "input_audio_buffer.clear", "conversation.item.delete", "conversation.item.retrieve",
})  # fmt: skip
