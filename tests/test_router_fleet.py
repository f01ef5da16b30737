"""omni-router discovering fake workers through a private real Redis: join, drain, leave,
heartbeat expiry, a worker killed under traffic, Redis going away and coming back, and
WebSocket sessions pinned to one worker."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis
import websockets

from fleet.redis_server import RedisServer
from fleet.store import FleetStore, connect
from tests.fakes.procs import FakeWorker, Router, chat, wait_for

pytestmark = pytest.mark.timeout(120)


def routable(router: Router) -> set[str]:
    return {w["id"] for w in router.diagnostics()["workers"] if w["routable"]}


def spread(router: Router, n: int, **kw: object) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _ in range(n):
        r = chat(router.url, **kw)
        assert r.status_code == 200, r.text
        wid = r.headers["x-omni-worker-id"]
        counts[wid] = counts.get(wid, 0) + 1
    return counts


def test_join_ready_drain_leave_and_heartbeat_expiry(redis_url: str) -> None:
    router = Router("--redis-url", redis_url, name="router-fleet")
    w1 = FakeWorker("w1", redis_url=redis_url)
    w2 = w3 = None
    try:
        wait_for(lambda: routable(router) == {"w1"}, 5)
        w2 = FakeWorker("w2", redis_url=redis_url)
        # routable within 1 s of registering ready (the fake registers right after it listens)
        t0 = time.monotonic()
        wait_for(lambda: routable(router) == {"w1", "w2"}, 5, interval=0.02)
        assert time.monotonic() - t0 < 1.0
        assert set(spread(router, 20)) == {"w1", "w2"}

        # drain: no new requests within 1 s
        w1.control("drain")
        t0 = time.monotonic()
        wait_for(lambda: routable(router) == {"w2"}, 5, interval=0.02)
        assert time.monotonic() - t0 < 1.0
        assert spread(router, 10) == {"w2": 10}
        assert router.metrics().count("omni_router_workers_draining 1.0") == 1

        # leave: deregistered at once
        w1.control("leave")
        wait_for(lambda: {w["id"] for w in router.diagnostics()["workers"]} == {"w2"}, 5)

        # a worker that stops heartbeating drops out when its record's TTL runs out
        w3 = FakeWorker("w3", "--ttl-ms", "600", redis_url=redis_url)
        wait_for(lambda: "w3" in routable(router), 5)
        w3.kill()
        wait_for(lambda: "w3" not in {w["id"] for w in router.diagnostics()["workers"]}, 5)
        assert spread(router, 5) == {"w2": 5}
    finally:
        router.stop()
        for w in (w1, w2, w3):
            if w is not None:
                w.stop()


@pytest.mark.slow
def test_worker_killed_under_traffic_fails_only_requests_it_had(
    redis_url: str, tmp_path: Path
) -> None:
    log1 = tmp_path / "w1.ids"
    w1 = FakeWorker("w1", "--delay-ms", "30", "--id-log", str(log1), redis_url=redis_url)
    w2 = FakeWorker("w2", "--delay-ms", "30", redis_url=redis_url)
    router = Router("--redis-url", redis_url, "--policy", "round_robin", name="router-kill")
    results: list[tuple[int, str, float]] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=10) as http:
            while not stop.is_set():
                started = time.monotonic()
                r = http.post(
                    router.url + "/v1/chat/completions",
                    json={"model": "fake-model", "messages": []},
                )
                results.append((r.status_code, r.headers.get("x-omni-worker-id", ""), started))

    try:
        wait_for(lambda: routable(router) == {"w1", "w2"}, 5)
        threads = [threading.Thread(target=client) for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        w1.kill()  # returns once the process is gone, its sockets closed by the kernel
        killed = time.monotonic()
        time.sleep(1.5)
        stop.set()
        for t in threads:
            t.join(15)
        reached_w1 = set(log1.read_text().split())
        failed = [(status, wid, t) for status, wid, t in results if status != 200]
        assert len(results) > 100 and len(reached_w1) > 20
        # every failure is a request the router had already sent to the killed worker (it was
        # dispatched to w1 and its client sent it before the kill completed); requests that
        # arrived later were never sent to the dead worker
        for status, wid, started in failed:
            assert status == 502 and wid == "w1" and started < killed, (status, wid)
        assert len(failed) <= 6  # at most one in flight per client connection
        after = spread(router, 10)
        assert after == {"w2": 10}
    finally:
        stop.set()
        router.stop()
        w1.stop()
        w2.stop()


def test_websocket_session_is_pinned_to_one_worker(redis_url: str) -> None:
    w1 = FakeWorker("w1", redis_url=redis_url)
    w2 = FakeWorker("w2", redis_url=redis_url)
    router = Router("--redis-url", redis_url, name="router-ws")
    ws_url = router.url.replace("http://", "ws://") + "/v1/realtime"

    async def session(headers: dict[str, str] | None = None) -> tuple[str, set[str]]:
        async with websockets.connect(ws_url, additional_headers=headers) as ws:
            worker = ws.response.headers["x-omni-worker-id"]
            prefixes = set()
            for i in range(10):
                await ws.send(f"hello {i}")
                reply = await asyncio.wait_for(ws.recv(), 5)
                prefix, _, text = str(reply).partition(":")
                assert text == f"hello {i}"
                prefixes.add(prefix)
            return worker, prefixes

    try:
        wait_for(lambda: routable(router) == {"w1", "w2"}, 5)
        for _ in range(3):
            worker, prefixes = asyncio.run(session())
            assert prefixes == {worker}  # every message of the session went to one worker
        first, _ = asyncio.run(session({"x-session-id": "call-42"}))
        for _ in range(3):  # same session key: same worker on every new connection
            assert asyncio.run(session({"x-session-id": "call-42"}))[0] == first
        assert w1.stats()["ws_messages"] + w2.stats()["ws_messages"] == 70
        wait_for(lambda: router.diagnostics()["router"]["websocket_sessions"] == 0, 5)
    finally:
        router.stop()
        w1.stop()
        w2.stop()


def test_websocket_close_codes_load_and_worker_loss(redis_url: str) -> None:
    """A session counts in its worker's load while open; the worker's close code reaches the
    client untouched; a worker that dies mid-session gets the client a 1011 from the router
    (not a hang or a bare TCP close); a reconnect with the same session id (header or
    ``session_id`` query parameter) lands on a live worker; a stopping router ends the
    sessions still open with 1001."""
    w1 = FakeWorker("w1", redis_url=redis_url)
    w2 = FakeWorker("w2", redis_url=redis_url)
    router = Router("--redis-url", redis_url, "--shutdown-grace-s", "0.5", name="router-ws-close")
    ws_url = router.url.replace("http://", "ws://") + "/v1/realtime"
    fakes = {"w1": w1, "w2": w2}

    def bound(session: str) -> str | None:
        client = redis.Redis.from_url(redis_url)
        try:
            keys = client.keys(f"*affinity:{session}")
            return client.get(keys[0]).decode() if keys else None
        finally:
            client.close()

    def worker_row(wid: str) -> dict:
        return next(w for w in router.diagnostics()["workers"] if w["id"] == wid)

    async def closed_with(ws: websockets.ClientConnection) -> int:
        with pytest.raises(websockets.ConnectionClosed) as info:
            await asyncio.wait_for(ws.recv(), 5)
        assert info.value.rcvd is not None, "no close frame: a bare TCP close"
        return info.value.rcvd.code

    async def scenario() -> None:
        headers = {"x-session-id": "call-7"}
        async with websockets.connect(ws_url, additional_headers=headers) as ws:
            first = ws.response.headers["x-omni-worker-id"]
            row = worker_row(first)
            assert (row["websocket_sessions"], row["in_flight"]) == (1, 1)
            await ws.send("close 1012")
            assert await closed_with(ws) == 1012  # the worker's code, untouched
        wait_for(lambda: worker_row(first)["in_flight"] == 0, 5)
        async with websockets.connect(ws_url, additional_headers=headers) as ws:
            assert ws.response.headers["x-omni-worker-id"] == first  # pinned by the key
            await ws.send("hello")
            assert str(await ws.recv()).startswith(first)
            fakes[first].kill()
            assert await closed_with(ws) == 1011
        async with websockets.connect(ws_url + "?model=fake-model&session_id=call-7") as ws:
            other = ws.response.headers["x-omni-worker-id"]
            assert other != first
            await ws.send("hello")
            assert str(await ws.recv()) == f"{other}:hello"
        # the binding followed the session: its next connection goes there at once
        wait_for(lambda: bound("call-7") == other, 5)

    async def router_stops() -> None:
        async with websockets.connect(ws_url) as ws:
            router.p.send_signal(signal.SIGTERM)
            assert await closed_with(ws) == 1001

    try:
        wait_for(lambda: routable(router) == {"w1", "w2"}, 5)
        asyncio.run(scenario())
        wait_for(lambda: router.diagnostics()["router"]["websocket_sessions"] == 0, 5)
        assert router.diagnostics()["router"]["in_flight"] == 0
        metrics = router.metrics()
        for line in (
            'omni_router_websocket_closes_total{by="worker",code="1012"} 1.0',
            'omni_router_websocket_closes_total{by="router",code="1011"} 1.0',
        ):
            assert line in metrics, metrics
        asyncio.run(router_stops())
    finally:
        router.stop()
        w1.stop()
        w2.stop()


def test_redis_going_away_and_coming_back() -> None:
    with RedisServer() as redis:
        w1 = FakeWorker("w1", redis_url=redis.url)
        router = Router("--redis-url", redis.url, name="router-redis")
        try:
            wait_for(lambda: routable(router) == {"w1"}, 5)
            assert router.ready()["redis"] == "ok"
            redis.stop()
            wait_for(lambda: router.ready()["redis"] == "unreachable", 5)
            ready = router.ready()
            assert ready["ready"] and "last known fleet view" in ready["detail"]
            assert router.diagnostics()["redis"]["state"] == "unreachable"
            assert "omni_router_redis_up 0.0" in router.metrics()
            # keeps routing on the last view, sessions included (hashed, no Redis round trip)
            assert spread(router, 5) == {"w1": 5}
            assert spread(router, 3, headers={"x-session-id": "s1"}) == {"w1": 3}
            assert 'omni_router_affinity_outcomes_total{outcome="hashed"} 3.0' in router.metrics()
            redis.start()  # same port, empty: the worker re-registers on its next heartbeat
            wait_for(lambda: router.ready()["redis"] == "ok", 10)
            wait_for(lambda: routable(router) == {"w1"}, 10)
            assert spread(router, 3, headers={"x-session-id": "s1"}) == {"w1": 3}
            assert "omni_router_redis_reconnects_total 1.0" in router.metrics()

            async def bound() -> str | None:
                store = FleetStore(connect(redis.url), "default")
                try:
                    return await store.lookup_session("s1", 10_000)
                finally:
                    await store.close()

            assert asyncio.run(bound()) == "w1"
        finally:
            router.stop()
            w1.stop()


def test_processes_share_one_port_and_the_session_bindings(redis_url: str) -> None:
    w1 = FakeWorker("w1", redis_url=redis_url)
    w2 = FakeWorker("w2", redis_url=redis_url)
    router = Router("--redis-url", redis_url, "--processes", "2", name="router-procs")
    try:
        pids: set[int] = set()

        def both_ready() -> bool:
            diag = httpx.get(router.url + "/diagnostics", timeout=2).json()
            if {w["id"] for w in diag["workers"] if w["routable"]} == {"w1", "w2"}:
                pids.add(diag["router"]["pid"])
            return len(pids) == 2

        # new connections land on either process (SO_REUSEPORT)
        wait_for(both_ready, 15, interval=0.01)
        bound = {r.headers["x-omni-worker-id"] for r in
                 (chat(router.url, headers={"x-session-id": "p1"}) for _ in range(10))}  # fmt: skip
        assert len(bound) == 1  # every process agrees on the session's worker
    finally:
        router.stop()
        w1.stop()
        w2.stop()
    assert router.p.returncode == 0
