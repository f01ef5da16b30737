"""A soak: a steady mixed load (chat, streamed chat, speech, streamed speech, realtime sessions)
on a live :class:`Fleet` for a while, with every router's and worker's memory (RSS, a worker's
stage processes included) and open descriptors, and Redis's memory, sampled every
``every_s`` seconds. What must hold: nothing lost or failed, and every series flat (its last
quarter's mean within a bound of its first quarter's, after a warm-up sample). ``pytest`` runs
it for 2 minutes (tests/reliability/test_soak.py); ``bench/soak.py`` for 30 and prints the
figures of docs/reliability.md."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.realtime_client import add_user_text, read_response, sdk_client
from tests.reliability.fleet import MODEL, Fleet
from tests.reliability.load import Load, Outcome, Summary

MIX = {"chat": 3, "chat_stream": 3, "speech": 1, "speech_stream": 1}
RATE = 4.0  # requests per second, open loop
# how much a series may grow from its first quarter to its last: memory by a share and a floor
# (allocator pools settle in steps), descriptors by a few (pooled connections come and go)
RSS_GROWTH = (0.10, 24 << 20)
FD_GROWTH = 16
REDIS_GROWTH = (0.10, 2 << 20)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@dataclass
class Sample:
    at: float
    rss: dict[str, int]  # process name -> bytes (a worker: its whole tree)
    fds: dict[str, int]
    redis_bytes: int


@dataclass
class SoakResult:
    seconds: float
    summary: Summary
    realtime_ok: int
    realtime_failed: list[str]
    samples: list[Sample] = field(default_factory=list)

    def series(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for s in self.samples:
            for name, v in s.rss.items():
                out.setdefault(f"{name} RSS", []).append(v)
            for name, v in s.fds.items():
                out.setdefault(f"{name} fds", []).append(v)
            out.setdefault("redis used_memory", []).append(s.redis_bytes)
        return out

    def growth(self) -> dict[str, tuple[float, float]]:
        """series -> (mean of its first quarter, mean of its last), the warm-up sample left out."""
        out = {}
        for name, values in self.series().items():
            values = values[1:]
            q = max(1, len(values) // 4)
            out[name] = (sum(values[:q]) / q, sum(values[-q:]) / q)
        return out

    def not_flat(self) -> list[str]:
        bad = []
        for name, (first, last) in self.growth().items():
            if name.endswith("fds"):
                limit = first + FD_GROWTH
            else:
                share, floor = REDIS_GROWTH if name.startswith("redis") else RSS_GROWTH
                limit = first + max(first * share, floor)
            if last > limit:
                bad.append(f"{name}: {first:,.0f} -> {last:,.0f} (bound {limit:,.0f})")
        return bad

    def table(self) -> str:
        rows = ["| series | first quarter | last quarter | change |", "|---|---:|---:|---:|"]
        for name, (first, last) in self.growth().items():
            unit = 1 if name.endswith("fds") else 1 << 20
            suffix = "" if unit == 1 else " MB"
            rows.append(
                f"| {name} | {first / unit:,.1f}{suffix} | {last / unit:,.1f}{suffix} "
                f"| {(last - first) / unit:+,.1f}{suffix} |"
            )
        return "\n".join(rows)


def _sample(fleet: Fleet) -> Sample:
    rss, fds = {}, {}
    for wid, w in fleet.workers.items():
        tree = fleet.tree(w)
        rss[f"worker {wid}"] = sum(_rss(p) for p in tree)
        fds[f"worker {wid}"] = sum(_fds(p) for p in tree)
    for r in fleet.routers:
        rss[r.name] = _rss(r.p.pid)
        fds[r.name] = _fds(r.p.pid)
    client = fleet.redis_client()
    try:
        used = int(client.info("memory")["used_memory"])
    finally:
        client.close()
    return Sample(time.monotonic(), rss, fds, used)


class _Realtime:
    """Realtime sessions one after another (a text turn each, through the routers in turn)
    until stopped; each must end in a finished response."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.ok = 0
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            router = self.fleet.routers[i % len(self.fleet.routers)].url
            client = sdk_client(router, self.fleet.api_key)
            try:
                async with client.realtime.connect(
                    model=MODEL, extra_headers={"x-session-id": f"soak-rt-{i % 8}"}
                ) as conn:
                    created = await conn.recv()
                    assert created.type == "session.created", created.type
                    text_only = {"type": "realtime", "output_modalities": ["text"]}
                    await conn.session.update(session=text_only | {"max_output_tokens": 8})
                    await add_user_text(conn, f"soak turn {i}")
                    await conn.response.create()
                    r = await read_response(conn)
                    assert r.status in ("completed", "incomplete"), r.status
                self.ok += 1
            except Exception as exc:  # the soak reports every failure
                self.failed.append(f"session {i}: {type(exc).__name__}: {exc}")
            finally:
                await client.close()
            i += 1
            await asyncio.sleep(0.5)


def soak(fleet: Fleet, seconds: float, every_s: float = 10.0, seed: int = 30) -> SoakResult:
    load = Load(
        fleet.router_urls, fleet.auth, n=int(seconds * RATE), rate=RATE, seed=seed, mix=MIX,
        sessions=[f"soak-{i}" for i in range(16)],
    )  # fmt: skip
    realtime = _Realtime(fleet)
    started = time.monotonic()
    samples = [_sample(fleet)]
    load.start()
    realtime.thread.start()
    try:
        while time.monotonic() - started < seconds:
            time.sleep(max(0.0, started + len(samples) * every_s - time.monotonic()))
            samples.append(_sample(fleet))
    finally:
        realtime.stop.set()
        outcomes: list[Outcome] = load.join()
        realtime.thread.join(60)
    fleet.wait_idle()
    samples.append(_sample(fleet))
    return SoakResult(
        time.monotonic() - started,
        Summary.of(outcomes),
        realtime.ok,
        realtime.failed,
        samples,
    )
