"""Session affinity through Redis: shared by router processes, kept over a router restart,
untouched by a worker joining, moved only for its own worker's drain or for bounded load."""

from __future__ import annotations

import asyncio

import pytest

from fleet.store import FleetStore, connect
from tests.fakes.procs import FakeWorker, Router, chat, wait_for

pytestmark = pytest.mark.timeout(120)


def routable(router: Router) -> set[str]:
    return {w["id"] for w in router.diagnostics()["workers"] if w["routable"]}


def worker_for(router: Router, session: str, via_user: bool = False) -> str:
    if via_user:
        r = chat(router.url, extra={"user": session})
    else:
        r = chat(router.url, headers={"x-session-id": session})
    assert r.status_code == 200, r.text
    return r.headers["x-omni-worker-id"]


def redis_moves(redis_url: str) -> int:
    async def read() -> int:
        store = FleetStore(connect(redis_url), "default")
        try:
            return await store.affinity_moves()
        finally:
            await store.close()

    return asyncio.run(read())


def test_affinity_across_two_routers_and_a_restart(redis_url: str) -> None:
    workers = [FakeWorker(f"w{i}", redis_url=redis_url) for i in (1, 2, 3)]
    a = Router("--redis-url", redis_url, name="router-a")
    b = Router("--redis-url", redis_url, name="router-b")
    try:
        for r in (a, b):
            wait_for(lambda r=r: routable(r) == {"w1", "w2", "w3"}, 5)
        sessions = [f"s{i}" for i in range(12)]
        bound = {s: worker_for(a, s, via_user=s.endswith(("1", "3"))) for s in sessions}
        assert len(set(bound.values())) > 1  # sessions spread over the fleet
        assert {s: worker_for(b, s) for s in sessions} == bound
        port = a.port
        a.stop()
        a = Router("--redis-url", redis_url, port=port, name="router-a2")
        wait_for(lambda: routable(a) == {"w1", "w2", "w3"}, 5)
        assert {s: worker_for(a, s) for s in sessions} == bound
        assert 'omni_router_affinity_outcomes_total{outcome="hit"} 12.0' in a.metrics()
        for w in workers:  # the worker saw every request of the sessions bound to it
            mine = {s for s, wid in bound.items() if wid == w.id}
            assert set(w.stats()["sessions"]) == mine
    finally:
        a.stop()
        b.stop()
        for w in workers:
            w.stop()


def test_join_moves_nothing_and_drain_moves_only_its_own_sessions(redis_url: str) -> None:
    w1 = FakeWorker("w1", redis_url=redis_url)
    w2 = FakeWorker("w2", redis_url=redis_url)
    w3 = None
    router = Router("--redis-url", redis_url, name="router-drain")
    try:
        wait_for(lambda: routable(router) == {"w1", "w2"}, 5)
        sessions = [f"user-{i}" for i in range(16)]
        bound = {s: worker_for(router, s) for s in sessions}
        assert set(bound.values()) == {"w1", "w2"}
        w3 = FakeWorker("w3", redis_url=redis_url)
        wait_for(lambda: routable(router) == {"w1", "w2", "w3"}, 5)
        assert {s: worker_for(router, s) for s in sessions} == bound  # a join moves nothing
        assert redis_moves(redis_url) == 0
        w1.control("drain")
        wait_for(lambda: routable(router) == {"w2", "w3"}, 5)
        after = {s: worker_for(router, s) for s in sessions}
        for s, wid in bound.items():
            if wid == "w1":
                assert after[s] in ("w2", "w3")
            else:
                assert after[s] == wid  # other workers' sessions stay put
        moved = sum(1 for wid in bound.values() if wid == "w1")
        assert redis_moves(redis_url) == moved
        metrics = router.metrics()
        assert f'omni_router_affinity_outcomes_total{{outcome="moved_ineligible"}} {moved}.0' in (
            metrics
        )
        assert {s: worker_for(router, s) for s in sessions} == after  # and stay where they went
    finally:
        router.stop()
        for w in (w1, w2, w3):
            if w is not None:
                w.stop()


def test_bounded_load_moves_a_hot_session_and_records_it(redis_url: str) -> None:
    workers = {i: FakeWorker(i, redis_url=redis_url) for i in ("w1", "w2")}
    router = Router("--redis-url", redis_url, "--affinity-bound", "1.25", name="router-bound")
    try:
        wait_for(lambda: routable(router) == {"w1", "w2"}, 5)
        first = worker_for(router, "hot")
        other = "w2" if first == "w1" else "w1"
        assert worker_for(router, "hot") == first
        # the bound worker reports a deep thinker queue: far above 1.25 x the mean
        workers[first].control("load", {"queue_depth": {"thinker": 50}})

        def loaded() -> bool:
            ws = {w["id"]: w for w in router.diagnostics()["workers"]}
            load = ws[first]["load"]
            return bool(load and load["queue_depth"].get("thinker") == 50)

        wait_for(loaded, 5)
        assert worker_for(router, "hot") == other
        assert redis_moves(redis_url) == 1
        metrics = router.metrics()
        assert 'omni_router_affinity_outcomes_total{outcome="moved_bounded_load"} 1.0' in metrics
        workers[first].control("load", {"queue_depth": {"thinker": 0}})
        assert worker_for(router, "hot") == other  # the new binding holds
    finally:
        router.stop()
        for w in workers.values():
            w.stop()


def test_sessions_stay_put_at_idle_load_with_the_default_policy(redis_url: str) -> None:
    """Two routers, three workers, the default policy (cache-aware) and bound: 20 sessions of 4
    requests each, one request at a time, alternating routers. Each worker reports its stages
    busy for a second after a request, as a real one does, so a session's next request finds
    its worker busy with nothing queued: that is no reason to move it (it once was)."""
    workers = [FakeWorker(f"w{i}", "--report-busy", redis_url=redis_url) for i in (1, 2, 3)]
    routers = [Router("--redis-url", redis_url, name=f"router-idle-{n}") for n in "ab"]
    try:
        for r in routers:
            wait_for(lambda r=r: routable(r) == {"w1", "w2", "w3"}, 5)
        answered: dict[str, set[str]] = {}
        for i in range(20):
            for k in range(4):
                wid = worker_for(routers[k % 2], f"idle-{i}")
                answered.setdefault(f"idle-{i}", set()).add(wid)
        moved = {s: ws for s, ws in answered.items() if len(ws) > 1}
        assert not moved, f"sessions answered by more than one worker: {moved}"
        assert redis_moves(redis_url) == 0
        assert len(set().union(*answered.values())) > 1  # (new sessions still spread by load)
    finally:
        for r in routers:
            r.stop()
        for w in workers:
            w.stop()
