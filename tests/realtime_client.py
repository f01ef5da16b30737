"""A voice client on the official ``openai`` SDK's realtime API, shared by the realtime fleet
tests and bench/bench_realtime.py: speech as input audio (espeak-ng's, tests/spoken.py), paced
streaming, and one response's events gathered (with the times the benchmark reads)."""

from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import dataclass, field
from typing import Any

import openai

from tests.spoken import speech_pcm  # noqa: F401 (the tests import it from here)

RATE = 24_000  # the API's PCM16 rate, in and out
CHUNK_S = 0.02  # what a microphone sends per event


def silence_pcm(seconds: float) -> bytes:
    return bytes(2 * int(seconds * RATE))


def b64(pcm: bytes) -> str:
    return base64.b64encode(pcm).decode()


async def stream_audio(conn: Any, pcm: bytes, paced: bool = True) -> float:
    """Append ``pcm`` in 20 ms events, at the speed it plays when ``paced`` (a live
    microphone); the monotonic time the last event went out."""
    step = 2 * int(CHUNK_S * RATE)
    start = time.monotonic()
    for i, at in enumerate(range(0, len(pcm), step)):
        if paced:
            wait = start + i * CHUNK_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        await conn.input_audio_buffer.append(audio=b64(pcm[at : at + step]))
    return time.monotonic()


async def add_user_text(conn: Any, text: str) -> None:
    """A user message item with one text part."""
    content = [{"type": "input_text", "text": text}]
    await conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": content}
    )


@dataclass
class Response:
    """One response as the client saw it."""

    id: str = ""
    status: str = ""
    text: str = ""  # output_text deltas
    transcript: str = ""  # output_audio_transcript deltas
    audio: bytearray = field(default_factory=bytearray)  # PCM16 at RATE
    usage: Any = None
    events: list[str] = field(default_factory=list)  # every event type, in order
    first_audio_at: float | None = None  # monotonic times
    first_text_at: float | None = None
    speech_stopped_at: float | None = None
    done_at: float | None = None
    output: list[Any] = field(default_factory=list)  # response.done's output items

    @property
    def audio_seconds(self) -> float:
        return len(self.audio) / 2 / RATE


async def read_response(conn: Any, on_event: Any = None) -> Response:
    """Events up to and including the next ``response.done``; an ``error`` event raises.
    ``on_event(event, response)`` sees each event first (a test cancels or kills from it)."""
    r = Response()
    while True:
        event = await conn.recv()
        now = time.monotonic()
        kind = event.type
        r.events.append(kind)
        if on_event is not None:
            await on_event(event, r)
        if kind == "error":
            raise RealtimeError(event.error)
        if kind == "input_audio_buffer.speech_stopped":
            r.speech_stopped_at = now
        elif kind == "response.created":
            r.id = event.response.id or ""
        elif kind == "response.output_audio.delta":
            r.first_audio_at = r.first_audio_at or now
            r.audio += base64.b64decode(event.delta)
        elif kind == "response.output_audio_transcript.delta":
            r.first_text_at = r.first_text_at or now
            r.transcript += event.delta
        elif kind == "response.output_text.delta":
            r.first_text_at = r.first_text_at or now
            r.text += event.delta
        elif kind == "response.done":
            r.done_at = now
            r.status = event.response.status or ""
            r.usage = event.response.usage
            r.output = list(event.response.output or [])
            return r


async def recv_strict(conn: Any) -> Any:
    """The next server event, validated in strict mode against the openai SDK's own models
    (``RealtimeServerEvent``): an event the SDK cannot parse fails here."""
    from openai.types.realtime import RealtimeServerEvent
    from pydantic import TypeAdapter

    return TypeAdapter(RealtimeServerEvent).validate_json(await conn.recv_bytes(), strict=True)


class RealtimeError(Exception):
    def __init__(self, error: Any) -> None:
        self.code = getattr(error, "code", None)
        super().__init__(f"{self.code}: {getattr(error, 'message', error)}")


def sdk_client(router_url: str, api_key: str) -> openai.AsyncOpenAI:
    """The SDK pointed at a router: ``base_url`` .../v1, so the realtime socket is
    ws://router/v1/realtime."""
    return openai.AsyncOpenAI(base_url=router_url + "/v1", api_key=api_key, max_retries=0)


def audio_session(voice: str | None = None, vad: dict | None = None, **extra: Any) -> dict:
    """A ``session.update`` body: audio out (with its transcript), PCM16 both ways,
    ``vad`` as the turn detection (None: manual commits), greedy unless ``extra`` says otherwise
    (sampled, the tiny talker's random weights may end a reply's speech at its first frames:
    a test that cuts or counts speech wants it long)."""
    audio: dict = {
        "input": {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": vad},
        "output": {"format": {"type": "audio/pcm", "rate": RATE}},
    }
    if voice:
        audio["output"]["voice"] = voice
    return {
        "type": "realtime", "output_modalities": ["audio"], "audio": audio, "temperature": 0,
        **extra,
    }  # fmt: skip
