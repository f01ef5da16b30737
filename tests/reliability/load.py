"""A bounded, seeded load generator that records the outcome of every request it sends.

It runs in a thread with its own event loop (asyncio + httpx), so that a scenario can inject a
fault while requests are in flight. The request mix, session keys, routers and pacing all come
from one ``random.Random(seed)``: the same seed sends the same requests in the same order.

Every request ends in exactly one of three results:
- ``ok``: a 2xx answer, complete (an SSE stream up to ``[DONE]``, a chunked body to its end);
- ``failed``: a clear failure the client can act on: an HTTP error with an OpenAI-style code, a
  stream that ended with an error event (its code), or a chunked/fixed-length body that was cut
  (code ``cut``: the client's HTTP library reports an incomplete body);
- ``lost``: no answer at all (connection refused or reset before a status line, a client-side
  timeout) or a stream that stopped without ``[DONE]`` and without an error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import orjson

MODEL = "tiny-omni"
VOICE = "chelsie"
KINDS = ("chat", "chat_stream", "speech", "speech_stream")
DEFAULT_MIX = {"chat": 4, "chat_stream": 3, "speech": 2, "speech_stream": 1}


@dataclass
class Outcome:
    i: int
    kind: str
    router: str
    session: str | None
    started: float = 0.0
    ended: float = 0.0
    status: int | None = None
    worker: str | None = None  # x-omni-worker-id of the answer
    result: str = "lost"  # ok | failed | lost
    code: str | None = None  # error code of a failure
    detail: str = ""
    headers_at: float | None = None  # when the status line arrived

    @property
    def label(self) -> str:
        """``ok``, ``lost`` or the failure's code, for tables."""
        return self.result if self.result != "failed" else f"{self.status or '-'} {self.code}"


@dataclass
class Summary:
    sent: int
    ok: int
    failed: Counter = field(default_factory=Counter)  # "<status> <code>" -> count
    lost: int = 0

    @classmethod
    def of(cls, outcomes: list[Outcome]) -> Summary:
        s = cls(sent=len(outcomes), ok=sum(o.result == "ok" for o in outcomes))
        s.failed = Counter(o.label for o in outcomes if o.result == "failed")
        s.lost = sum(o.result == "lost" for o in outcomes)
        return s

    def failed_text(self) -> str:
        return ", ".join(f"{k}: {v}" for k, v in sorted(self.failed.items())) or "-"


def _body(kind: str, rng: random.Random, session: str | None) -> tuple[str, dict, dict]:
    """Path, JSON body and extra headers of one request. A chat carries its session key in the
    body's ``user`` (OpenAI's field); speech has no such field, so it uses ``x-session-id``."""
    words = " ".join(rng.choice(("omni", "fleet", "router", "worker", "audio")) for _ in range(4))
    if kind.startswith("chat"):
        body: dict = {
            "model": MODEL,
            "messages": [{"role": "user", "content": words}],
            "max_tokens": rng.choice((4, 8, 12)),
        }
        if kind == "chat_stream":
            body["stream"] = True
        path = "/v1/chat/completions"
    else:
        # greedy: sampled, the tiny talker's random weights may end a reply at its first code
        # (no audio at all), which this load could not tell from a lost stream
        body = {
            "model": MODEL, "input": words, "voice": VOICE, "response_format": "wav",
            "temperature": 0,
        }  # fmt: skip
        if kind == "speech_stream":
            body |= {"response_format": "pcm", "stream": True}
        path = "/v1/audio/speech"
    headers = {}
    if session is not None:
        if kind.startswith("chat"):
            body["user"] = session
        else:
            headers["x-session-id"] = session
    return path, body, headers


class Load:
    """``n`` requests from a seeded mix, at most ``concurrency`` at once, started at ``rate``
    per second (open loop, so that requests keep arriving while a fault happens)."""

    def __init__(
        self,
        routers: list[str],
        headers: dict[str, str],
        *,
        n: int = 100,
        rate: float = 20.0,
        concurrency: int = 8,
        seed: int = 1,
        mix: dict[str, int] | None = None,
        sessions: list[str] | None = None,
        session_share: float = 0.5,
        timeout: float = 30.0,
    ) -> None:
        self.routers = routers
        self.headers = headers
        self.n = n
        self.rate = rate
        self.concurrency = concurrency
        self.timeout = timeout
        rng = random.Random(seed)
        mix = mix or DEFAULT_MIX
        kinds = list(mix)
        self.plan: list[tuple[str, str, str | None, str, dict, dict]] = []
        for i in range(n):
            kind = rng.choices(kinds, [mix[k] for k in kinds])[0]
            session = rng.choice(sessions) if sessions and rng.random() < session_share else None
            path, body, extra = _body(kind, rng, session)
            self.plan.append((kind, routers[i % len(routers)], session, path, body, extra))
        self.outcomes: list[Outcome] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.started = 0.0
        self.error: BaseException | None = None

    # -- control from the scenario's thread ------------------------------------------------

    def start(self) -> Load:
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Send no more requests (the ones in flight finish)."""
        self._stop.set()

    def join(self, timeout: float = 300) -> list[Outcome]:
        assert self._thread is not None
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"load generator still running after {timeout}s")
        if self.error is not None:
            raise self.error
        return self.outcomes

    def run(self) -> list[Outcome]:
        return self.start().join()

    def done(self) -> int:
        return sum(1 for o in self.outcomes if o.ended)

    def wait_done(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.done() < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {self.done()} of {count} requests done in {timeout}s")
            time.sleep(0.02)

    # -- the event loop ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaced by join()
            self.error = exc

    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=self.concurrency * 2)
        sem = asyncio.Semaphore(self.concurrency)
        async with httpx.AsyncClient(limits=limits, timeout=self.timeout) as client:
            self.started = time.monotonic()
            tasks = []
            for i, (kind, router, session, path, body, extra) in enumerate(self.plan):
                delay = self.started + i / self.rate - time.monotonic()
                while delay > 0 and not self._stop.is_set():
                    await asyncio.sleep(min(delay, 0.1))
                    delay = self.started + i / self.rate - time.monotonic()
                await sem.acquire()
                if self._stop.is_set():
                    sem.release()
                    break
                o = Outcome(i, kind, router, session, started=time.monotonic())
                self.outcomes.append(o)
                task = asyncio.create_task(
                    self._one(client, o, router + path, body, self.headers | extra)
                )
                task.add_done_callback(lambda _t: sem.release())
                tasks.append(task)
            await asyncio.gather(*tasks)

    async def _one(
        self, client: httpx.AsyncClient, o: Outcome, url: str, body: dict, headers: dict
    ) -> None:
        try:
            async with client.stream("POST", url, json=body, headers=headers) as r:
                o.headers_at = time.monotonic()
                o.status = r.status_code
                o.worker = r.headers.get("x-omni-worker-id")
                if r.status_code >= 400:
                    data = await r.aread()
                    o.result, o.code = "failed", _error_code(data, r.status_code)
                    o.detail = data[:200].decode(errors="replace")
                elif o.kind.endswith("_stream") and o.kind.startswith("chat"):
                    await self._sse(r, o)
                else:
                    n = 0
                    async for piece in r.aiter_raw():
                        n += len(piece)
                    o.result = "ok" if n > 0 else "lost"
        except httpx.RemoteProtocolError as exc:
            if o.status is None:
                o.detail = f"no answer: {exc}"
            else:  # the body was cut after the headers: the client knows it is incomplete
                o.result, o.code, o.detail = "failed", "cut", str(exc)
        except (httpx.TransportError, OSError) as exc:
            o.detail = f"{type(exc).__name__}: {exc}"
            if o.status is not None and not isinstance(exc, httpx.TimeoutException):
                o.result, o.code = "failed", "cut"
        finally:
            o.ended = time.monotonic()

    async def _sse(self, r: httpx.Response, o: Outcome) -> None:
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                o.result = "ok"
                continue
            with contextlib.suppress(orjson.JSONDecodeError):
                doc = orjson.loads(data)
                if isinstance(doc, dict) and "error" in doc:
                    o.result, o.code = "failed", str(doc["error"].get("code"))
                    o.detail = data[:200]
                    return
        if o.result != "ok":
            o.detail = "stream ended without [DONE] and without an error event"


def _error_code(data: bytes, status: int) -> str:
    try:
        return str(orjson.loads(data)["error"]["code"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return f"http_{status}"


def by_worker(outcomes: list[Outcome]) -> Counter:
    return Counter(o.worker for o in outcomes)


def session_workers(outcomes: list[Outcome]) -> dict[str, set[str]]:
    """Session key -> the workers that answered it successfully."""
    out: dict[str, set[str]] = {}
    for o in outcomes:
        if o.session is not None and o.result == "ok" and o.worker:
            out.setdefault(o.session, set()).add(o.worker)
    return out
