"""Fault-injection scenarios against a live :class:`Fleet`. Each one drives seeded load, injects
one fault, asserts the scenario's invariants (AssertionError with the evidence) and returns a
:class:`Result` for the report table. ``pytest`` and ``bench/reliability_report.py`` run the same
functions."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

import httpx

from tests.reliability import failover
from tests.reliability.fleet import KEYS, Fleet, wait_until
from tests.reliability.load import Load, Outcome, Summary

SESSIONS = [f"rel-session-{i}" for i in range(12)]
# what a client may see from a request that was on a worker when it failed
FAILURE_CODES_ON_VICTIM = {"stream_interrupted", "cut", "worker_unavailable", "worker_timeout"}


@dataclass
class Result:
    name: str
    summary: Summary
    recovery_s: float | None = None
    recovery_what: str = ""
    notes: list[str] = field(default_factory=list)


def _explain(outcomes: list[Outcome], pick) -> str:
    bad = [o for o in outcomes if pick(o)]
    return "\n".join(
        f"  #{o.i} {o.kind} via {o.router} worker={o.worker} {o.label} "
        f"t={o.started:.2f}..{o.ended:.2f} {o.detail[:160]}"
        for o in bad[:20]
    )


def bindings(fleet: Fleet, sessions: list[str] = SESSIONS) -> dict[str, str | None]:
    """Session key -> bound worker id, as Redis holds it."""
    client = fleet.redis_client()
    try:
        raw = client.mget([KEYS.affinity(s) for s in sessions])
    finally:
        client.close()
    return {s: (v.decode() if v else None) for s, v in zip(sessions, raw, strict=True)}


def bind_sessions(fleet: Fleet, sessions: list[str] = SESSIONS) -> dict[str, str]:
    """One small request per session (through alternating routers), so that each is bound."""
    for i, s in enumerate(sessions):
        r = httpx.post(
            fleet.routers[i % len(fleet.routers)].url + "/v1/chat/completions",
            headers=fleet.auth,
            json={"model": "tiny-omni", "max_tokens": 2, "user": s,
                  "messages": [{"role": "user", "content": "bind"}]},
            timeout=30,
        )  # fmt: skip
        assert r.status_code == 200, r.text
    found = bindings(fleet, sessions)
    assert all(found.values()), found
    return found  # type: ignore[return-value]


def assert_sessions_stayed(outcomes: list[Outcome], before: dict[str, str], moved: set[str]):
    """Every successful answer of a session not in ``moved`` came from its bound worker."""
    wrong = [
        o
        for o in outcomes
        if o.session in before
        and o.session not in moved
        and o.result == "ok"
        and o.worker != before[o.session]
    ]
    assert not wrong, "sessions answered by another worker:\n" + _explain(wrong, lambda _o: True)


def _untouched(outcomes: list[Outcome], name: str) -> Summary:
    s = Summary.of(outcomes)
    assert s.lost == 0 and not s.failed, f"{name}: {s}\n" + _explain(
        outcomes, lambda o: o.result != "ok"
    )
    return s


def _time_until(check, timeout: float, what: str, since: float) -> float:
    wait_until(check, timeout, what, interval=0.05)
    return time.monotonic() - since


# -- 1. SIGKILL --------------------------------------------------------------------------------


def worker_killed(fleet: Fleet, seed: int = 1) -> Result:
    fleet.ensure(3)
    before = bind_sessions(fleet)
    victim = max(set(before.values()), key=lambda w: list(before.values()).count(w))
    w = fleet.workers[victim]
    pinned = next(k for k, v in before.items() if v == victim)
    resumed_before = failover.resumed(fleet)
    watched = failover.references(fleet, pinned)
    load = Load(fleet.router_urls, fleet.auth, n=150, rate=15, seed=seed, sessions=SESSIONS)
    load.start()
    load.wait_done(40)
    killed, streams_ended = failover.watch_through(fleet, pinned, watched, w.pid, w.kill)
    fleet.retire(victim)
    recovery = _time_until(
        lambda: all(victim not in fleet.routable(r) for r in fleet.routers),
        10,
        f"{victim} out of every router's view",
        killed,
    )
    outcomes = load.join()
    streams_ended()
    s = Summary.of(outcomes)
    # the watched streams on it went on from another worker, each equal to its undisturbed run
    for ws in watched:
        assert ws.worker == victim, (ws.name, ws.worker)
        ws.check()
    resumed = failover.check_resumed(fleet, resumed_before, watched)
    # nothing is lost; streams resume and unanswered requests are resent, so nothing fails
    # either, unless a reply had been cut in its head (only requests on the victim)
    assert s.lost == 0, _explain(outcomes, lambda o: o.result == "lost")
    elsewhere = [o for o in outcomes if o.result == "failed" and o.worker != victim]
    assert not elsewhere, "failures not on the killed worker:\n" + _explain(
        elsewhere, lambda _o: True
    )
    broken = [o for o in outcomes if o.result == "failed" and o.status == 200]
    assert not broken, "streams that did not resume:\n" + _explain(broken, lambda _o: True)
    codes = {o.code for o in outcomes if o.result == "failed"}
    assert codes <= FAILURE_CODES_ON_VICTIM, codes
    late = [o for o in outcomes if o.result == "failed" and o.started > killed + 0.2]
    assert not late, "requests that started after the kill failed:\n" + _explain(
        late, lambda _o: True
    )
    # its sessions move on their next request, the others stay
    mine = {k for k, v in before.items() if v == victim}
    bind_sessions(fleet, sorted(mine))
    after = bindings(fleet)
    assert_sessions_stayed(outcomes, before, mine)
    assert all(after[k] == v for k, v in before.items() if k not in mine), (before, after)
    moved = {k for k in mine if after[k] not in (None, victim)}
    assert all(after[k] != victim for k in mine), after
    fleet.wait_converged()
    return Result(
        "1 worker SIGKILL",
        s,
        round(recovery, 2),
        "killed -> out of every router",
        [
            f"victim {victim} held {len(mine)} sessions; {len(moved)} re-bound elsewhere",
            f"{resumed} streams resumed on another worker, the 3 watched ones equal to their "
            "undisturbed runs (greedy and seeded text, pcm audio byte for byte)",
        ],
    )


# -- 2. SIGTERM drain --------------------------------------------------------------------------


def worker_drained(fleet: Fleet, seed: int = 2) -> Result:
    fleet.ensure(2)
    before = bind_sessions(fleet)
    victim = max(set(before.values()), key=lambda w: list(before.values()).count(w))
    w = fleet.workers[victim]
    load = Load(fleet.router_urls, fleet.auth, n=120, rate=15, seed=seed, sessions=SESSIONS)
    load.start()
    load.wait_done(30)
    termed = time.monotonic()
    w.proc.send_signal(signal.SIGTERM)
    out_at = _time_until(
        lambda: all(victim not in fleet.routable(r) for r in fleet.routers),
        5,
        f"{victim} out of rotation",
        termed,
    )
    code = w.wait_exit(90)
    exited = time.monotonic() - termed
    fleet.retire(victim)
    outcomes = load.join()
    s = _untouched(outcomes, "drain")
    assert code == 0, f"drained worker exited {code}:\n{w.log()}"
    late = [o for o in outcomes if o.started > termed + out_at + 0.2 and o.worker == victim]
    assert not late, "new requests reached the draining worker:\n" + _explain(late, lambda _o: True)
    mine = {k for k, v in before.items() if v == victim}
    assert_sessions_stayed(outcomes, before, mine)
    client = fleet.redis_client()
    assert client.get(KEYS.worker(victim)) is None and not client.sismember(KEYS.workers, victim)
    client.close()
    fleet.wait_converged()
    return Result(
        "2 worker SIGTERM drain",
        s,
        round(exited, 2),
        "SIGTERM -> exit 0",
        [f"out of rotation after {out_at:.2f}s; exit code {code}"],
    )


# -- 3. SIGSTOP / SIGCONT ----------------------------------------------------------------------


def worker_hung(fleet: Fleet, seed: int = 3, stopped_s: float = 5.0) -> Result:
    fleet.ensure(3)
    before = bind_sessions(fleet)
    victim = max(set(before.values()), key=lambda w: list(before.values()).count(w))
    w = fleet.workers[victim]
    pinned = next(k for k, v in before.items() if v == victim)
    resumed_before = failover.resumed(fleet)
    watched = failover.references(fleet, pinned)
    # (8 a second: on these 2 cores the two remaining workers take the hung one's share, its
    # streams' replays included, and a burst over their capacity times out anywhere)
    load = Load(fleet.router_urls, fleet.auth, n=160, rate=8, seed=seed)
    load.start()
    load.wait_done(30)
    stopped, streams_ended = failover.watch_through(
        fleet, pinned, watched, w.pid, lambda: fleet.signal_tree(w, signal.SIGSTOP)
    )
    try:
        out_s = _time_until(
            lambda: all(victim not in fleet.routable(r) for r in fleet.routers),
            15,
            f"hung {victim} out of rotation",
            stopped,
        )
        streams_ended()  # they resumed elsewhere once its heartbeat lapsed
        resumed_s = time.monotonic() - stopped
        time.sleep(max(0.0, stopped_s - resumed_s))
    finally:
        fleet.signal_tree(w, signal.SIGCONT)
    resumed = time.monotonic()
    back_s = _time_until(
        lambda: all(victim in fleet.routable(r) for r in fleet.routers),
        30,
        f"{victim} back in rotation",
        resumed,
    )
    outcomes = load.join()
    s = Summary.of(outcomes)
    for ws in watched:
        assert ws.worker == victim, (ws.name, ws.worker)
        ws.check()
    n_resumed = failover.check_resumed(fleet, resumed_before, watched)
    assert s.lost == 0, _explain(outcomes, lambda o: o.result == "lost")
    elsewhere = [o for o in outcomes if o.result == "failed" and o.worker != victim]
    assert not elsewhere, "failures not on the hung worker:\n" + _explain(
        elsewhere, lambda _o: True
    )
    broken = [o for o in outcomes if o.result == "failed" and o.status == 200]
    assert not broken, "streams that did not resume:\n" + _explain(broken, lambda _o: True)
    codes = {o.code for o in outcomes if o.result == "failed"}
    assert codes <= FAILURE_CODES_ON_VICTIM, codes
    # once it was out of rotation, new requests did not go to it until it came back
    late = [
        o for o in outcomes if stopped + out_s + 0.3 < o.started < resumed and o.worker == victim
    ]
    assert not late, _explain(late, lambda _o: True)
    served_after = [o for o in outcomes if o.started > resumed + back_s and o.worker == victim]
    fleet.wait_converged()
    return Result(
        "3 worker SIGSTOP/SIGCONT",
        s,
        round(out_s + back_s, 2),
        "out of rotation + back after SIGCONT",
        [
            f"out of rotation {out_s:.2f}s after SIGSTOP; its streams ({n_resumed}) resumed "
            f"elsewhere within {resumed_s:.2f}s, equal to their undisturbed runs; routable "
            f"{back_s:.2f}s after SIGCONT; {len(served_after)} requests served by it afterwards"
        ],
    )


# -- 4. Redis killed and restarted -------------------------------------------------------------


def redis_restarted(fleet: Fleet, seed: int = 4, down_s: float = 3.0) -> Result:
    fleet.ensure(2)
    load = Load(fleet.router_urls, fleet.auth, n=150, rate=15, seed=seed, sessions=SESSIONS)
    load.start()
    load.wait_done(20)
    fleet.redis.stop(kill=True)
    down_at = time.monotonic()
    wait_until(
        lambda: all(
            httpx.get(r.url + "/ready", timeout=2).json()["redis"] == "unreachable"
            for r in fleet.routers
        ),
        10,
        "routers report Redis unreachable",
    )
    time.sleep(max(0.0, down_s - (time.monotonic() - down_at)))
    fleet.redis.start()
    restarted = time.monotonic()
    client = fleet.redis_client()
    workers = set(fleet.workers)

    def converged() -> bool:
        if {m.decode() for m in client.smembers(KEYS.workers)} != workers:
            return False
        for r in fleet.routers:
            ready = httpx.get(r.url + "/ready", timeout=2).json()
            if ready["redis"] != "ok" or fleet.routable(r) != workers:
                return False
        return True

    recovery = _time_until(converged, 15, "fleet view converged after the restart", restarted)
    client.close()
    outcomes = load.join()
    s = _untouched(outcomes, "redis restart")
    assert all(r.alive() for r in fleet.routers)
    assert all(w.proc.poll() is None for w in fleet.workers.values())
    return Result(
        "4 Redis killed + restarted",
        s,
        round(recovery, 2),
        "Redis back -> view converged",
        [f"Redis down {restarted - down_at:.1f}s"],
    )


# -- 5. router restart -------------------------------------------------------------------------


def router_restarted(fleet: Fleet, seed: int = 5) -> Result:
    fleet.ensure(2)
    before = bind_sessions(fleet)
    first = Load(fleet.router_urls, fleet.auth, n=40, rate=20, seed=seed, sessions=SESSIONS)
    first.run()
    # streams in flight on router 0 when it gets SIGTERM finish (graceful stop); new requests
    # meanwhile go to router 1 (a client or balancer retries a refused connection elsewhere)
    r0 = fleet.routers[0].url
    streams = {"chat_stream": 1, "speech_stream": 1}
    inflight = Load([r0], fleet.auth, n=6, rate=100, concurrency=6, seed=seed, mix=streams,
                    sessions=SESSIONS, session_share=1.0)  # fmt: skip
    inflight.start()
    # every one of them connected first: a request sent after the SIGTERM meets a closed port
    wait_until(
        lambda: sum(o.headers_at is not None for o in inflight.outcomes) == 6, 30, "streams on"
    )
    survivor = fleet.routers[1].url
    during = Load([survivor], fleet.auth, n=40, rate=20, seed=seed + 100, sessions=SESSIONS)
    during.start()
    down = time.monotonic()
    fleet.restart_router(0)
    back = time.monotonic() - down
    wait_until(lambda: fleet.routable(fleet.routers[0]) == set(fleet.workers), 10, "view rebuilt")
    after = Load(fleet.router_urls, fleet.auth, n=60, rate=20, seed=seed + 200, sessions=SESSIONS)
    outcomes = first.outcomes + inflight.join() + during.join() + after.run()
    s = _untouched(outcomes, "router restart")
    assert_sessions_stayed(outcomes, before, set())
    assert bindings(fleet) == before
    restarted = [o for o in after.outcomes if o.router == fleet.routers[0].url and o.session]
    assert restarted, "no session request went through the restarted router"
    return Result(
        "5 router restart",
        s,
        round(back, 2),
        "SIGTERM -> restarted router live",
        [f"{len(restarted)} session requests through the restarted router kept their worker"],
    )


# -- 6. a worker joins under load --------------------------------------------------------------


def worker_joins(fleet: Fleet, seed: int = 6) -> Result:
    fleet.ensure(2)
    before = bind_sessions(fleet)
    started = time.monotonic()
    newcomer = fleet.add_worker()
    fresh = [f"rel-new-{i}" for i in range(40)]
    load = Load(fleet.router_urls, fleet.auth, n=600, rate=4, concurrency=4, seed=seed,
                sessions=SESSIONS + fresh, session_share=0.7)  # fmt: skip
    load.start()
    try:
        newcomer.wait_ready(300)
        joined = _time_until(
            lambda: all(newcomer.worker_id in fleet.routable(r) for r in fleet.routers),
            10,
            "newcomer routable",
            started,
        )
        wait_until(
            lambda: sum(o.worker == newcomer.worker_id for o in load.outcomes if o.ended) >= 8,
            60,
            "the newcomer serves requests",
        )
    finally:
        load.stop()
    outcomes = load.join()
    s = _untouched(outcomes, "join")
    assert_sessions_stayed(outcomes, before, set())
    new_sessions = {
        o.session for o in outcomes if o.worker == newcomer.worker_id and o.session is not None
    }
    assert not new_sessions & set(before), "an existing session moved to the newcomer"
    fleet.wait_converged()
    return Result(
        "6 worker joins under load",
        s,
        round(joined, 2),
        "process start -> routable",
        [f"newcomer took {len(new_sessions)} new sessions; existing sessions stayed"],
    )


# -- 7. a stage process crashes inside a worker ------------------------------------------------


def stage_crashed(fleet: Fleet, seed: int = 7) -> Result:
    fleet.ensure(2)
    victim = sorted(fleet.workers)[0]
    w = fleet.workers[victim]
    processes = httpx.get(w.url + "/health", timeout=5).json()["processes"]
    stage_pid = next(pid for name, pid in processes.items() if name.endswith("/talker"))
    mix = {"chat": 2, "chat_stream": 2, "speech": 3, "speech_stream": 3}
    load = Load(fleet.router_urls, fleet.auth, n=150, rate=12, seed=seed, mix=mix)
    load.start()
    load.wait_done(25)
    killed = time.monotonic()
    os.kill(stage_pid, signal.SIGKILL)
    noticed = _time_until(
        lambda: httpx.get(w.url + "/ready", timeout=2).status_code != 200,
        10,
        f"{victim} reports itself not ready",
        killed,
    )
    recovery = _time_until(
        lambda: (
            httpx.get(w.url + "/ready", timeout=2).status_code == 200
            and all(victim in fleet.routable(r) for r in fleet.routers)
        ),
        180,
        f"{victim} recovered",
        killed,
    )
    outcomes = load.join()
    s = Summary.of(outcomes)
    assert s.lost == 0, _explain(outcomes, lambda o: o.result == "lost")
    elsewhere = [o for o in outcomes if o.result == "failed" and o.worker != victim]
    assert not elsewhere, "failures outside the crashed worker:\n" + _explain(
        elsewhere, lambda _o: True
    )
    codes = {o.code for o in outcomes if o.result == "failed"}
    assert codes <= {"stage_failed", "cut", "stream_interrupted"}, codes
    slow = [o for o in outcomes if o.result == "failed" and o.ended - max(o.started, killed) > 5]
    assert not slow, "failures were not fast:\n" + _explain(slow, lambda _o: True)
    r = httpx.post(
        w.url + "/v1/audio/speech",
        headers=w.headers,
        json={"model": "tiny-omni", "input": "back", "voice": "chelsie"},
        timeout=30,
    )
    assert r.status_code == 200 and r.content[:4] == b"RIFF", r.text
    return Result(
        "7 stage process crash",
        s,
        round(recovery, 2),
        "stage killed -> worker routable",
        [f"talker process of {victim} SIGKILLed; not ready after {noticed:.2f}s"],
    )
