"""Streams watched through a fault: a greedy chat stream, a seeded sampled one and a streamed
pcm speech, pinned (by session key) to the worker the scenario breaks. Each is first served
undisturbed for its reference; then all three run, the worker is frozen once every one of them
is part way, and the fault comes only where the freeze left every stream cut short (what the
worker had sent reached the client, and none is whole): each stream's rest must come from
another worker. Each must still end whole and equal to its reference (text delta for delta,
audio byte for byte): the router resumed every one of them (docs/reliability.md)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx
import orjson

from tests.reliability.fleet import Fleet
from tests.reliability.load import MODEL, VOICE

PROMPT = [{"role": "user", "content": "tell me a long story about omni fleets"}]
SPEECH_TEXT = "omni fleet router worker audio " * 4
STREAMS = (
    ("greedy chat", "/v1/chat/completions",
     {"model": MODEL, "messages": PROMPT, "temperature": 0, "stream": True,
      "stream_options": {"include_usage": True}}),
    ("seeded chat", "/v1/chat/completions",
     {"model": MODEL, "messages": PROMPT, "temperature": 1.0, "seed": 11, "stream": True}),
    ("speech pcm", "/v1/audio/speech",
     {"model": MODEL, "input": SPEECH_TEXT, "voice": VOICE, "response_format": "pcm",
      "stream": True, "seed": 12}),
)  # fmt: skip
# how far each stream must be before the fault: SSE events (the role, then a token), or audio
# pieces
PART_WAY = {"greedy chat": 2, "seeded chat": 2, "speech pcm": 1}
# how long a frozen worker's last bytes may take to reach the client through the router
SETTLE_S = 0.5


@dataclass
class Watched:
    name: str
    path: str
    body: dict
    reference: bytes = b""
    data: bytearray = field(default_factory=bytearray)
    progress: int = 0  # events (SSE) or pieces (audio) received
    worker: str = ""
    finished: bool = False
    error: str = ""

    @property
    def sse(self) -> bool:
        return self.path.endswith("/completions")

    def content(self, data: bytes) -> list:
        """What must be equal: every chat event but its id and created, or the audio. (The
        usage's ``cached_tokens`` says what the serving worker's prefix cache held, which
        differs between a first run and a later one.)"""
        if not self.sse:
            return [data]
        events = []
        for line in data.decode().split("\n"):
            if line.startswith("data: {"):
                doc = orjson.loads(line[6:])
                (doc.get("usage") or {}).pop("prompt_tokens_details", None)
                events.append({k: v for k, v in doc.items() if k not in ("id", "created")})
            elif line.startswith("data: "):
                events.append(line)
        return events

    def check(self) -> None:
        assert self.finished and not self.error, (self.name, self.error)
        got, want = self.content(bytes(self.data)), self.content(self.reference)
        assert got == want, f"{self.name}: resumed stream differs from the undisturbed one, " + (
            _first_difference(got, want) if self.sse else _first_difference(got[0], want[0])
        )
        if self.sse:  # one stream: one id and one created in every event
            docs = [orjson.loads(ln[6:]) for ln in self.data.decode().split("\n")
                    if ln.startswith("data: {")]  # fmt: skip
            assert len({(d["id"], d["created"]) for d in docs}) == 1, self.name
            assert "error" not in docs[-1], docs[-1]


def _first_difference(got: Sequence, want: Sequence) -> str:
    pairs = zip(got, want, strict=False)
    at = next((i for i, (g, w) in enumerate(pairs) if g != w), min(len(got), len(want)))
    return f"at {at} of {len(got)} (undisturbed {len(want)}): {got[at : at + 2]!r} vs " + repr(
        want[at : at + 2]
    )


def _read(router: str, fleet: Fleet, w: Watched, session: str, into: bytearray | None) -> bytes:
    buf = bytearray() if into is None else into
    headers = {**fleet.auth, "x-session-id": session}
    with httpx.stream("POST", router + w.path, json=w.body, headers=headers, timeout=120) as r:
        assert r.status_code == 200, r.read()
        w.worker = r.headers["x-omni-worker-id"]
        for piece in r.iter_raw():
            buf += piece
            if into is not None:
                w.progress = buf.count(b"\n\ndata: ") if w.sse else w.progress + 1
    return bytes(buf)


def resumed(fleet: Fleet) -> int:
    """Streams the routers resumed on another worker, over every route."""
    total = 0.0
    for r in fleet.routers:
        for m in re.finditer(
            r'omni_router_stream_failovers_total\{outcome="resumed",route="\w+"\} ([\d.]+)',
            r.metrics(),
        ):
            total += float(m[1])
    return int(total)


def check_resumed(fleet: Fleet, before: int, watched: list[Watched]) -> int:
    """Every watched stream was cut short by the fault (``watch_through`` saw to it) and ended
    whole (``Watched.check``): the routers resumed each on another worker, with the victim's
    other streams. How many streams resumed since ``before``."""
    n = resumed(fleet) - before
    assert n >= len(watched), (n, [w.name for w in watched])
    return n


def references(fleet: Fleet, session: str) -> list[Watched]:
    """The three streams of ``session``, each served once undisturbed for its reference."""
    streams = [Watched(n, p, b) for n, p, b in STREAMS]
    for w in streams:
        w.reference = _read(fleet.routers[0].url, fleet, w, session, None)
    return streams


def watch_through(
    fleet: Fleet, session: str, streams: list[Watched], pid: int, fault: Callable[[], None]
) -> tuple[float, Callable[[], None]]:
    """The ``streams`` of ``session`` (bound to the worker whose HTTP process is ``pid``): the
    speech first, the chats once it is part way; once each is part way the worker is frozen
    (SIGSTOP: nothing more leaves it) and, after ``SETTLE_S`` for what it had sent to reach
    the client, ``fault()`` comes while it is still frozen. A round in which a stream was whole
    by then (its timing is the loaded fleet's) is thawed, let finish and run again, three
    rounds at most: the fault must cut every stream short. (The time of the fault, a call that
    waits until every stream has ended.)"""
    router = fleet.routers[0].url

    def run(w: Watched) -> None:
        try:
            _read(router, fleet, w, session, w.data)
            w.finished = True
        except Exception as exc:  # reported by check()
            w.error = f"{type(exc).__name__}: {exc}"

    def part_way(group: list[Watched]) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(
            w.progress >= PART_WAY[w.name] or w.finished for w in group
        ):
            time.sleep(0.001)

    # The speech first: under load its first audio (the thinker, the talker's queue, its first
    # frames, the vocoder) came after the whole of a greedy chat started beside it, in every
    # round of a full run; a chat started once the speech is part way has its first tokens
    # while the speech goes on.
    speech = [w for w in streams if not w.sse]
    chats = [w for w in streams if w.sse]
    for _ in range(3):
        for w in streams:
            w.data, w.progress, w.finished, w.error = bytearray(), 0, False, ""
        threads = {w.name: threading.Thread(target=run, args=(w,), daemon=True) for w in streams}
        for group in (speech, chats):
            for w in group:
                threads[w.name].start()
            part_way(group)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(SETTLE_S)
        whole = {w.name: bytes(w.data[-300:]) for w in streams if w.finished}
        progress = {w.name: w.progress for w in streams}
        if not whole:
            break
        os.kill(pid, signal.SIGCONT)
        for t in threads.values():
            t.join(120)
    assert not whole, f"whole before the fault, so not resumed: {whole} (at {progress})"
    at = time.monotonic()
    fault()

    def join() -> None:
        for t in threads.values():
            t.join(120)

    return at, join
