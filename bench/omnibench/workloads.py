"""One request of each kind, sent and timed as a client sees it.

Times are ``time.perf_counter()`` seconds from the request's start: a chat's first token and
the gaps between tokens; a speech reply's first audible chunk and how a real-time player would
have played it; a transcription's latency over the clip's length; a realtime voice turn from the
end of the user's audio to the first audible audio of the response.
"""

from __future__ import annotations

import base64
import itertools
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import httpx
import orjson
import websockets

from bench.omnibench.playback import audible, play
from bench.omnibench.prompts import AUDIO_RATE, CLIP_SECONDS, Prompt, speech_pcm, wav


class Kind(StrEnum):
    """A workload; its value is also the endpoint it needs (``fleet.records.Endpoint``, as
    ``/v1/models`` lists a model's ``capabilities.endpoints``)."""

    CHAT = "chat"
    SPEECH = "speech"
    TRANSCRIPTION = "transcription"
    REALTIME = "realtime"


@dataclass
class Sample:
    """One request, as measured. Seconds throughout; ``None`` where a figure does not apply."""

    kind: str
    level: float  # the offered load it ran under (requests/s, or concurrency)
    index: int  # its place in the level's sequence
    sent_s: float  # when it was sent, from the level's start
    ok: bool = False
    error: str | None = None
    e2e_s: float | None = None
    first_token_s: float | None = None  # chat
    tpot_s: float | None = None  # chat: (end - first token) / (tokens - 1)
    itl_s: list[float] = field(default_factory=list)  # chat: gaps between streamed pieces
    output_tokens: int | None = None
    first_audio_s: float | None = None  # speech, realtime: first audible chunk
    audio_s: float | None = None  # speech, realtime: audio out; transcription: the clip's
    rtf: float | None = None  # speech: e2e / audio out; transcription: e2e / clip
    underruns: int | None = None  # speech, realtime: times the player ran dry
    stall_s: float | None = None
    # answered, but with nothing in it (no token, no audible audio): silent, which the report
    # does not count as a success (a tiny model with random weights may end at once); its
    # end-to-end time is measured, the figures of its output are None
    empty: bool = False

    @property
    def first_output_s(self) -> float | None:
        """What a user waits for: the first token, the first audible audio, or (a
        transcription, which comes whole) the reply."""
        for value in (self.first_audio_s, self.first_token_s):
            if value is not None:
                return value
        return self.e2e_s if self.kind == Kind.TRANSCRIPTION else None


@dataclass(frozen=True)
class Target:
    """Where the requests go and what the model there serves."""

    base_url: str  # http://host:port
    model: str
    voice: str | None
    headers: dict[str, str]
    max_tokens: int
    speech_max_chars: int


class RequestFailed(Exception):
    """A reply that was not a success: its status and the error's code."""


async def _fail_from(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    body = await response.aread()
    try:
        code = orjson.loads(body)["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        code = body[:120].decode(errors="replace")
    raise RequestFailed(f"HTTP {response.status_code} {code}")


async def chat(client: httpx.AsyncClient, target: Target, prompt: Prompt, sample: Sample) -> None:
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": prompt.text}],
        "max_tokens": prompt.max_tokens or target.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    pieces: list[float] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        await _fail_from(response)
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = orjson.loads(line[6:])
            if "error" in event:
                raise RequestFailed(f"stream error {event['error'].get('code')}")
            if event.get("usage"):
                sample.output_tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices") or ():
                if (choice.get("delta") or {}).get("content"):
                    pieces.append(time.perf_counter() - start)
    sample.e2e_s = time.perf_counter() - start
    sample.empty = not pieces
    if pieces:
        sample.first_token_s = pieces[0]
        sample.itl_s = [b - a for a, b in itertools.pairwise(pieces)]
        tokens = sample.output_tokens or len(pieces)
        if tokens > 1:
            sample.tpot_s = (sample.e2e_s - pieces[0]) / (tokens - 1)


class _Pcm:
    """Streamed PCM16 as it arrives: chunks may split a sample, a player needs whole ones."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.carry = b""
        self.chunks: list[tuple[float, float]] = []  # (arrival, audio seconds)
        self.first_audible: float | None = None

    def add(self, data: bytes) -> None:
        data, self.carry = self.carry + data, b""
        if len(data) % 2:
            data, self.carry = data[:-1], data[-1:]
        if not data:
            return
        now = time.perf_counter() - self.start
        self.chunks.append((now, len(data) / 2 / AUDIO_RATE))
        if self.first_audible is None and audible(data):
            self.first_audible = now

    def finish(self, sample: Sample) -> None:
        playback = play(self.chunks)
        sample.audio_s = playback.audio_s
        if self.first_audible is None:  # silence, or nothing at all
            sample.empty = True
            return
        sample.first_audio_s = self.first_audible
        sample.underruns, sample.stall_s = playback.underruns, playback.stall_s
        assert sample.e2e_s is not None
        sample.rtf = sample.e2e_s / playback.audio_s


async def speech(client: httpx.AsyncClient, target: Target, prompt: Prompt, sample: Sample) -> None:
    body: dict[str, Any] = {
        "model": target.model,
        "input": prompt.text[: target.speech_max_chars],
        "response_format": "pcm",
        "stream": True,
    }
    if target.voice:
        body["voice"] = target.voice
    start = time.perf_counter()
    pcm = _Pcm(start)
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        await _fail_from(response)
        async for data in response.aiter_bytes():
            pcm.add(data)
    sample.e2e_s = time.perf_counter() - start
    pcm.finish(sample)


async def transcription(
    client: httpx.AsyncClient, target: Target, prompt: Prompt, sample: Sample
) -> None:
    seconds = CLIP_SECONDS[sample.index % len(CLIP_SECONDS)]
    clip = wav(speech_pcm(seconds, seed=sample.index), AUDIO_RATE)
    start = time.perf_counter()
    response = await client.post(
        "/v1/audio/transcriptions",
        data={"model": target.model, "response_format": "json"},
        files={"file": ("clip.wav", clip, "audio/wav")},
    )
    await _fail_from(response)
    sample.e2e_s = time.perf_counter() - start
    if not isinstance(response.json().get("text"), str):
        raise RequestFailed("no text in the reply")
    sample.audio_s = seconds
    sample.rtf = sample.e2e_s / seconds


async def realtime(
    client: httpx.AsyncClient, target: Target, prompt: Prompt, sample: Sample
) -> None:
    """A voice turn with turn detection off: the clip is appended and committed, a response
    asked for; the clock starts when the commit has gone (the user stopped speaking)."""
    seconds = CLIP_SECONDS[sample.index % len(CLIP_SECONDS)]
    clip = speech_pcm(seconds, seed=sample.index)
    url = target.base_url.replace("http", "ws", 1) + f"/v1/realtime?model={target.model}"
    session: dict[str, Any] = {
        "type": "realtime",
        "output_modalities": ["audio"],
        "audio": {"input": {"turn_detection": None}},
    }
    if target.voice:
        session["audio"]["output"] = {"voice": target.voice}
    async with websockets.connect(
        url, additional_headers=target.headers, max_size=None, open_timeout=30
    ) as ws:

        async def send(event: dict[str, Any]) -> None:
            await ws.send(orjson.dumps(event).decode())

        await send({"type": "session.update", "session": session})
        step = 2 * AUDIO_RATE // 10  # 100 ms a message: not paced, the clip is recorded
        for at in range(0, len(clip), step):
            audio = base64.b64encode(clip[at : at + step]).decode()
            await send({"type": "input_audio_buffer.append", "audio": audio})
        await send({"type": "input_audio_buffer.commit"})
        start = time.perf_counter()
        await send(
            {"type": "response.create", "response": {"max_output_tokens": target.max_tokens}}
        )
        pcm = _Pcm(start)
        async for message in ws:
            event = orjson.loads(message)
            kind = event.get("type")
            if kind == "error":
                raise RequestFailed(f"error event {event['error'].get('code')}")
            if kind == "response.output_audio.delta":
                pcm.add(base64.b64decode(event["delta"]))
            elif kind == "response.done":
                status = event["response"].get("status")
                details = event["response"].get("status_details") or {}
                # a reply cut at max_output_tokens is a whole answer for this purpose, as a
                # chat cut at max_tokens is
                if status != "completed" and details.get("reason") != "max_output_tokens":
                    raise RequestFailed(f"response {status} {details.get('reason') or ''}")
                break
    sample.e2e_s = time.perf_counter() - start
    pcm.finish(sample)


RUN = {
    Kind.CHAT: chat,
    Kind.SPEECH: speech,
    Kind.TRANSCRIPTION: transcription,
    Kind.REALTIME: realtime,
}


async def measure(
    client: httpx.AsyncClient, target: Target, kind: Kind, prompt: Prompt, sample: Sample
) -> Sample:
    """Run one request into ``sample``; a failure is recorded in it, never raised."""
    try:
        await RUN[kind](client, target, prompt, sample)
        sample.ok = True
    except RequestFailed as exc:
        sample.error = str(exc)
    except (httpx.HTTPError, websockets.WebSocketException, OSError, TimeoutError) as exc:
        sample.error = f"{type(exc).__name__}: {exc}"[:200]
    return sample
