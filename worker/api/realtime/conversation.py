"""A session's conversation: OpenAI-shaped items in order, bounded, mirrored to Redis
(``fleet.conversations``) at every change, and turned into the engine's chat messages: messages,
and the function calls the model made with the results the client gave back (``function_call``,
``function_call_output``: the chat template's assistant ``tool_calls`` and ``tool`` turns).

Items keep what the model needs again: user audio as the client sent it (base64 PCM16 24 kHz),
assistant turns as their text or transcript. Events show items without their audio bytes;
``conversation.item.retrieve`` returns them whole."""

from __future__ import annotations

import base64
import logging
import uuid

import numpy as np
import redis.exceptions

from fleet.conversations import ConversationStore
from worker.api.realtime.errors import Code, RealtimeError
from worker.api.realtime.events import ItemIn
from worker.api.realtime.g711 import PCM
from worker.api.realtime.input_audio import decode_input, decode_pcm16, to_model_rate

log = logging.getLogger(__name__)

_TEXT_TYPES = {
    "user": ("input_text", "text"),
    "system": ("input_text", "text"),
    "assistant": ("output_text", "text"),
}
_AUDIO_TYPES = {"user": ("input_audio", "audio"), "assistant": ("output_audio", "audio")}
# An interrupted reply keeps the words its sent audio had time to say, at a typical speaking
# rate, when the whole reply's audio length is unknown.
SPOKEN_CHARS_PER_SECOND = 15.0


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def message_item(role: str, content: list[dict], item_id: str | None = None, status="completed"):
    return {
        "id": item_id or new_id("item"),
        "object": "realtime.item",
        "type": "message",
        "status": status,
        "role": role,
        "content": content,
    }


def function_call_item(call_id: str, name: str, arguments: str, item_id: str | None = None):
    return {
        "id": item_id or new_id("item"),
        "object": "realtime.item",
        "type": "function_call",
        "status": "completed",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def public(item: dict) -> dict:
    """The item as events show it: no audio bytes, no internal fields."""
    shown = {k: v for k, v in item.items() if not k.startswith("_")}
    if item.get("type", "message") != "message":
        return shown
    content = [{k: v for k, v in c.items() if k != "audio"} for c in item.get("content", [])]
    return shown | {"content": content}


def spoken_text(text: str, spoken_s: float, total_s: float | None) -> str:
    """The part of ``text`` that ``spoken_s`` seconds of its audio said: a proportional cut
    when the whole audio lasts ``total_s``, else at ``SPOKEN_CHARS_PER_SECOND``."""
    if total_s is not None and total_s > 0:
        keep = round(len(text) * min(1.0, spoken_s / total_s))
    else:
        keep = int(spoken_s * SPOKEN_CHARS_PER_SECOND)
    if keep >= len(text):
        return text
    cut = text[:keep]
    space = cut.rfind(" ")
    return cut[:space] if space >= keep * 3 // 4 else cut  # a word end, if one is near


def without_oldest_turns(messages: list[dict]) -> list[dict] | None:
    """``messages`` less the older half of its turns (a leading system message stays); None
    when only the last turn is left."""
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    turns = messages[len(system) :]
    if len(turns) <= 1:
        return None
    return [*system, *turns[len(turns) // 2 :]]


def check_text(text: str, limit: int, param: str) -> None:
    """Text over the model's context (its byte bound) is refused before any tokenizing."""
    if len(text.encode("utf-8", "surrogatepass")) > limit:
        raise RealtimeError(
            Code.CONTEXT_LENGTH_EXCEEDED,
            f"text over {limit} bytes, more than this model's context can hold",
            param,
        )


def item_from_client(
    given: ItemIn, max_audio_bytes: int, max_text_bytes: int, audio_format: str = PCM
) -> dict:
    """A client's ``conversation.item.create`` item, checked: content types fit the role, text
    fits the context, audio is valid in the session's input format and within the buffer
    limit (kept as PCM16 24 kHz); a function call or its output has the fields of its kind."""
    if given.type != "message":
        return _function_item(given, max_text_bytes)
    if given.role is None or given.content is None:
        missing = "role" if given.role is None else "content"
        raise RealtimeError(
            Code.INVALID_REQUEST, f"a message item needs its {missing}", f"item.{missing}"
        )
    for field in ("call_id", "name", "arguments", "output"):
        if getattr(given, field) is not None:
            raise RealtimeError(
                Code.INVALID_REQUEST, f"a message item has no {field}", f"item.{field}"
            )
    texts = [p.text or p.transcript or "" for p in given.content]
    check_text("".join(texts), max_text_bytes, "item.content")
    content: list[dict] = []
    for i, part in enumerate(given.content):
        param = f"item.content.{i}"
        if part.type in _TEXT_TYPES[given.role]:
            content.append({"type": _TEXT_TYPES[given.role][0], "text": part.text or ""})
        elif given.role in _AUDIO_TYPES and part.type in _AUDIO_TYPES[given.role]:
            kind = _AUDIO_TYPES[given.role][0]
            if given.role == "assistant" or part.audio is None:
                content.append({"type": kind, "transcript": part.transcript or ""})
                continue
            pcm = decode_input(part.audio, audio_format, param + ".audio")
            if len(pcm) > max_audio_bytes:
                raise RealtimeError(
                    Code.INPUT_AUDIO_BUFFER_FULL,
                    f"an audio item holds at most {max_audio_bytes} bytes of PCM16",
                    param + ".audio",
                )
            stored = base64.b64encode(pcm).decode()
            content.append({"type": kind, "audio": stored, "transcript": part.transcript})
        else:
            raise RealtimeError(
                Code.INVALID_REQUEST,
                f"a {given.role} item cannot hold {part.type!r} content",
                param + ".type",
            )
    return message_item(given.role, content, given.id)


def _function_item(given: ItemIn, max_text_bytes: int) -> dict:
    """A ``function_call`` (call_id, name, arguments) or ``function_call_output`` (call_id,
    output) item from the client."""
    need = (
        ("call_id", "name", "arguments") if given.type == "function_call" else ("call_id", "output")
    )
    for field in ("role", "content", "call_id", "name", "arguments", "output"):
        given_value = getattr(given, field)
        if field in need and given_value is None:
            raise RealtimeError(
                Code.INVALID_REQUEST, f"a {given.type} item needs its {field}", f"item.{field}"
            )
        if field not in need and given_value is not None:
            raise RealtimeError(
                Code.INVALID_REQUEST, f"a {given.type} item has no {field}", f"item.{field}"
            )
    assert given.call_id is not None
    if given.type == "function_call":
        assert given.name is not None and given.arguments is not None
        check_text(given.arguments, max_text_bytes, "item.arguments")
        return function_call_item(given.call_id, given.name, given.arguments, given.id)
    assert given.output is not None
    check_text(given.output, max_text_bytes, "item.output")
    return {
        "id": given.id or new_id("item"),
        "object": "realtime.item",
        "type": "function_call_output",
        "call_id": given.call_id,
        "output": given.output,
    }


class Conversation:
    def __init__(
        self,
        store: ConversationStore | None,
        name: str,
        max_items: int,
        items: list[dict] | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.max_items = max_items
        self.items: list[dict] = list(items or [])[-max_items:]
        self._clips: dict[str, np.ndarray] = {}  # decoded user audio by item id

    # -- lookups -----------------------------------------------------------------------------

    def index(self, item_id: str, param: str = "item_id") -> int:
        for i, item in enumerate(self.items):
            if item["id"] == item_id:
                return i
        raise RealtimeError(Code.ITEM_NOT_FOUND, f"no item {item_id!r} in this conversation", param)

    def get(self, item_id: str) -> dict:
        return self.items[self.index(item_id)]

    def last_id(self) -> str | None:
        return self.items[-1]["id"] if self.items else None

    # -- changes (each one stored) -----------------------------------------------------------

    async def add(self, item: dict, previous_item_id: str | None = None, store=True) -> str | None:
        """Insert ``item`` after ``previous_item_id`` ("root": first; default: last). Returns
        the id of the item before it."""
        if any(i["id"] == item["id"] for i in self.items):
            raise RealtimeError(Code.INVALID_REQUEST, f"item id {item['id']!r} exists", "item.id")
        if previous_item_id is None or (self.items and previous_item_id == self.last_id()):
            at = len(self.items)
        elif previous_item_id == "root":
            at = 0
        else:
            at = self.index(previous_item_id, "previous_item_id") + 1
        before = self.items[at - 1]["id"] if at > 0 else None
        self.items.insert(at, item)
        dropped = len(self.items) > self.max_items
        if dropped:
            for old in self.items[: -self.max_items]:
                self._clips.pop(old["id"], None)
            self.items = self.items[-self.max_items :]
        if store:
            if at == len(self.items) - 1 or dropped:
                await self._persist(lambda s: s.append(self.name, item))
            else:
                await self._rewrite()
        return before

    async def store_item(self, item: dict) -> None:
        """Store an item added with ``store=False`` (a reply, once it is done)."""
        if self.items and self.items[-1]["id"] == item["id"]:
            await self._persist(lambda s: s.append(self.name, item))
        else:
            await self._rewrite()

    async def delete(self, item_id: str) -> None:
        del self.items[self.index(item_id)]
        self._clips.pop(item_id, None)
        await self._rewrite()

    async def truncate(self, item_id: str, content_index: int, audio_end_ms: int) -> None:
        """The client played ``audio_end_ms`` of an assistant item's audio: the transcript keeps
        what that much audio said."""
        item = self.get(item_id)
        if item.get("role") != "assistant":
            raise RealtimeError(Code.INVALID_REQUEST, "only assistant items truncate", "item_id")
        if content_index >= len(item["content"]):
            raise RealtimeError(Code.INVALID_REQUEST, "no such content part", "content_index")
        part = item["content"][content_index]
        if part.get("type") != "output_audio":
            raise RealtimeError(Code.INVALID_REQUEST, "that part holds no audio", "content_index")
        total_ms = item.get("_audio_ms")
        if total_ms is not None and audio_end_ms > total_ms:
            raise RealtimeError(
                Code.INVALID_REQUEST,
                f"audio_end_ms {audio_end_ms} is past the item's audio ({total_ms} ms)",
                "audio_end_ms",
            )
        spoken = spoken_text(
            part.get("transcript") or "",
            audio_end_ms / 1000,
            total_ms / 1000 if total_ms else None,
        )
        part["transcript"] = spoken
        item["_audio_ms"] = audio_end_ms
        await self._rewrite()

    async def set_transcript(self, item_id: str, content_index: int, transcript: str) -> None:
        """A user audio part's transcript arrived (input audio transcription)."""
        self.get(item_id)["content"][content_index]["transcript"] = transcript
        await self._rewrite()

    async def _rewrite(self) -> None:
        await self._persist(lambda s: s.replace(self.name, self.items))

    async def _persist(self, write) -> None:
        if self.store is None:
            return
        try:
            await write(self.store)
        except (redis.exceptions.RedisError, OSError) as exc:
            # The live session goes on from memory; only a resume elsewhere would miss this.
            log.warning("conversation %s not stored: %s", self.name, exc)

    # -- the engine's view -------------------------------------------------------------------

    def clip(self, item_id: str, data: str) -> np.ndarray:
        """A user audio part as the encoder takes it (decoded once per item)."""
        clip = self._clips.get(item_id)
        if clip is None:
            clip = self._clips[item_id] = to_model_rate(decode_pcm16(data))
        return clip

    def messages(self, instructions: str, extra: list[dict] | None = None) -> list[dict]:
        """Chat messages for ``GenerationRequest``: text as strings; user audio as ``audio``
        parts (float32 at the encoder's rate), which the Qwen3-Omni preprocessing takes; the
        model's function calls as its turn's ``tool_calls``, their outputs as ``tool`` turns."""
        out: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
        for item in [*self.items, *(extra or [])]:
            if item.get("type") == "function_call":
                call = {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]},
                }
                if out and out[-1]["role"] == "assistant" and isinstance(out[-1]["content"], str):
                    out[-1].setdefault("tool_calls", []).append(call)  # the same turn's calls
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": [call]})
                continue
            if item.get("type") == "function_call_output":
                out.append(
                    {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
                )
                continue
            if item.get("type") != "message":
                continue
            texts: list[str] = []
            clips: list[dict] = []
            for part in item["content"]:
                if part.get("audio") and item["role"] == "user":
                    clips.append({"type": "audio", "audio": self.clip(item["id"], part["audio"])})
                else:
                    texts.append(part.get("text") or part.get("transcript") or "")
            text = "".join(texts)
            if clips:
                parts = [*clips, *([{"type": "text", "text": text}] if text else [])]
                out.append({"role": item["role"], "content": parts})
            else:
                out.append({"role": item["role"], "content": text})
        return out
