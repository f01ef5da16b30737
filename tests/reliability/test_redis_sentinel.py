"""Redis fails over under load: a primary, its replica and a real ``redis-sentinel`` started
here; two tiny-omni workers and two routers reach Redis through the ``redis+sentinel://`` URL.
The primary is SIGKILLed while 32 clients stream; the sentinel promotes the replica. No request
is lost or fails (routers route on their last view meanwhile), routers and workers follow the
new primary (records rewritten there, every router's Redis up again), and the session bindings
written before the failover survive it and still route."""

from __future__ import annotations

import time

import httpx
import pytest
import redis

from tests.fakes.procs import Router
from tests.reliability.fleet import KEYS, SENTINEL_SERVICE, Fleet, wait_until
from tests.reliability.load import Load, Summary
from tests.reliability.scenarios import SESSIONS, _explain, bind_sessions, bindings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
STREAMS = {"chat_stream": 3, "speech_stream": 1}


def replica_has_everything(fleet: Fleet) -> bool:
    """Replication is asynchronous: what the primary acknowledged has reached the replica."""
    primary = fleet.redis_client()
    try:
        offset = primary.info("replication")["master_repl_offset"]
    finally:
        primary.close()
    assert fleet.replica is not None
    follower = redis.Redis.from_url(fleet.replica.url, socket_timeout=2)
    try:
        return follower.info("replication").get("slave_repl_offset", -1) >= offset
    finally:
        follower.close()


def synced_since(fleet: Fleet, router: Router, seconds_ago: float) -> bool:
    """The router's discovery has read the fleet from Redis within the last ``seconds_ago``."""
    state = fleet.diagnostics(router)["redis"]
    age = state["last_sync_age_s"]
    return state["state"] == "ok" and age is not None and age < seconds_ago


def test_redis_primary_killed_under_32_streaming_clients_sentinel_fails_over() -> None:
    fleet = Fleet(n_workers=2, n_routers=2, sentinel=True).start()
    try:
        assert fleet.sentinel is not None and fleet.replica is not None
        before = bind_sessions(fleet)
        wait_until(lambda: replica_has_everything(fleet), 10, "the replica in sync")
        load = Load(fleet.router_urls, fleet.auth, n=240, rate=60, concurrency=32, seed=21,
                    mix=STREAMS, sessions=SESSIONS)  # fmt: skip
        load.start()
        load.wait_done(40)
        killed = time.monotonic()
        fleet.redis.stop(kill=True)
        wait_until(
            lambda: fleet.sentinel.master_port(SENTINEL_SERVICE) == fleet.replica.port,
            20,
            "the sentinel promotes the replica",
        )
        promoted = time.monotonic() - killed
        # the daemons follow the new primary: the workers' records are rewritten there (the
        # replicated ones expire within their 2 s TTL) and every router reads it again
        time.sleep(2.5)
        client = fleet.redis_client()
        try:
            assert client.info("replication")["role"] == "master"
            wait_until(
                lambda: all(client.exists(KEYS.worker(w)) for w in fleet.workers),
                20,
                "the workers' records on the new primary",
            )
        finally:
            client.close()
        wait_until(
            lambda: all(synced_since(fleet, r, time.monotonic() - killed) for r in fleet.routers),
            20,
            "every router reading the new primary",
        )
        followed = time.monotonic() - killed  # while the load still runs
        outcomes = load.join()
        s = Summary.of(outcomes)
        assert s.lost == 0 and not s.failed, f"{s}\n" + _explain(
            outcomes, lambda o: o.result != "ok"
        )
        fleet.wait_converged()
        # the bindings survived, and a session's next request goes where it is bound
        assert bindings(fleet) == before
        for session, worker in list(before.items())[:4]:
            r = httpx.post(
                fleet.routers[1].url + "/v1/chat/completions",
                headers=fleet.auth,
                json={"model": "tiny-omni", "max_tokens": 2, "user": session,
                      "messages": [{"role": "user", "content": "still here?"}]},
                timeout=30,
            )  # fmt: skip
            assert r.status_code == 200 and r.headers["x-omni-worker-id"] == worker
        print(
            f"\nsentinel failover: {s}; replica promoted {promoted:.2f}s after the kill, "
            f"records rewritten there and routers reading it {followed:.2f}s after"
        )
    finally:
        fleet.close()
