"""Bounded-load affinity decides on the load that includes the request, never on a stale
report: sessions sent one request at a time stay on their worker, while a worker that is
really over ``bound x mean`` still sheds sessions."""

from __future__ import annotations

import itertools
import re

import pytest

from tests.fakes.procs import FakeWorker, Router, chat, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def routable(router: Router) -> set[str]:
    return {w["id"] for w in router.diagnostics()["workers"] if w["routable"]}


def test_sessions_stay_put_at_idle_load(redis_url: str) -> None:
    # each request takes 60 ms, so the workers' load reports (every 200 ms) often catch one
    # in flight and are stale by the time the session's next request arrives
    workers = [FakeWorker(f"w{i}", "--delay-ms", "60", redis_url=redis_url) for i in (1, 2, 3)]
    routers = [Router("--redis-url", redis_url, name=f"router-{n}") for n in ("a", "b")]
    try:
        for r in routers:
            wait_for(lambda r=r: routable(r) == {"w1", "w2", "w3"}, 10)
        alternate = itertools.cycle(routers)
        for run in range(3):
            seen: dict[str, set[str]] = {}
            for i in range(20):
                session = f"run{run}-s{i}"
                for _ in range(4):  # one request at a time, through either router
                    r = chat(next(alternate).url, headers={"x-session-id": session})
                    assert r.status_code == 200, r.text
                    seen.setdefault(session, set()).add(r.headers["x-omni-worker-id"])
            moved = {s: ws for s, ws in seen.items() if len(ws) > 1}
            assert not moved, f"run {run}: sessions moved at idle load: {moved}"
        for r in routers:
            assert 'outcome="moved_bounded_load"} 0.0' in r.metrics()
    finally:
        for r in routers:
            r.stop()
        for w in workers:
            w.stop()


def test_moves_off_a_hot_worker_are_counted_and_summed_up_in_the_log(redis_url: str) -> None:
    workers = {i: FakeWorker(i, redis_url=redis_url) for i in ("w1", "w2")}
    router = Router(
        "--redis-url", redis_url, name="router-moves", env={"OMNI_MOVE_LOG_INTERVAL_S": "1"}
    )
    try:
        wait_for(lambda: routable(router) == {"w1", "w2"}, 10)
        bound = {}
        for i in range(12):
            r = chat(router.url, headers={"x-session-id": f"m{i}"})
            bound[f"m{i}"] = r.headers["x-omni-worker-id"]
        hot = max(workers, key=lambda w: sum(1 for b in bound.values() if b == w))
        on_hot = [s for s, w in bound.items() if w == hot]
        workers[hot].control("load", {"queue_depth": {"thinker": 50}})

        def loaded() -> bool:
            ws = {w["id"]: w for w in router.diagnostics()["workers"]}
            return bool(ws[hot]["load"] and ws[hot]["load"]["queue_depth"].get("thinker") == 50)

        wait_for(loaded, 5)
        for s in on_hot:  # skewed load: every session on the hot worker moves off it
            r = chat(router.url, headers={"x-session-id": s})
            assert r.headers["x-omni-worker-id"] != hot
        metric = 'omni_router_affinity_outcomes_total{outcome="moved_bounded_load"} '
        assert metric + f"{len(on_hot)}.0" in router.metrics()

        def summed_up() -> int:  # the moves, as told by the summary lines (one a second)
            lines = re.findall(
                r"sessions moved in the last 1s: (\d+) moved_bounded_load", router.output()
            )
            return sum(int(n) for n in lines)

        wait_for(lambda: summed_up() == len(on_hot), 5)
        assert "session moved " not in router.output()  # no line per move
    finally:
        router.stop()
        for w in workers.values():
            w.stop()
