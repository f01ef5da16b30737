"""The Redis contract: records expire with heartbeats, affinity is atomic, voices round-trip."""

from __future__ import annotations

import asyncio

import pytest

from fleet.errors import ErrorCode, error_body
from fleet.records import EventKind, FleetEvent, LoadReport, VoiceRecord, WorkerRecord
from fleet.settings import redacted_url
from fleet.store import FleetStore, VoiceOwnedByAnotherKey, VoiceQuotaExceeded, connect


def record(worker_id: str = "w1") -> WorkerRecord:
    return WorkerRecord(
        id=worker_id, url="http://127.0.0.1:9", node="n1", model="tiny", served_models=["tiny"]
    )


@pytest.fixture
async def store(redis_url: str):
    s = FleetStore(connect(redis_url), fleet="test")
    yield s
    await s.close()


async def test_record_expires_without_heartbeat_and_is_pruned(store: FleetStore) -> None:
    await store.write_record(record(), ttl_ms=200)
    assert list(await store.snapshot()) == ["w1"]
    await asyncio.sleep(0.3)
    assert await store.snapshot() == {}
    assert await store.redis.smembers(store.keys.workers) == set()


async def test_heartbeat_keeps_record_and_rewrites_a_lost_one(store: FleetStore) -> None:
    rec = record()
    await store.write_record(rec, ttl_ms=300)
    for _ in range(3):
        await asyncio.sleep(0.15)
        assert await store.heartbeat(rec, ttl_ms=300) is True
    await store.redis.flushall()  # as if Redis restarted empty
    assert await store.heartbeat(rec, ttl_ms=300) is False
    assert list(await store.snapshot()) == ["w1"]


async def test_snapshot_carries_latest_load(store: FleetStore) -> None:
    await store.write_record(record(), ttl_ms=1000)
    await store.publish_load(LoadReport(worker_id="w1", in_flight=3), ttl_ms=1000)
    view = (await store.snapshot())["w1"]
    assert view.load is not None and view.load.in_flight == 3


async def test_session_binding_is_first_writer_wins(store: FleetStore) -> None:
    results = await asyncio.gather(
        *(store.bind_session("s1", f"w{i}", ttl_ms=5000) for i in range(10))
    )
    assert len(set(results)) == 1
    assert await store.lookup_session("s1", ttl_ms=5000) == results[0]


async def test_move_session_only_from_the_expected_worker(store: FleetStore) -> None:
    await store.bind_session("s1", "w1", ttl_ms=5000)
    assert await store.move_session("s1", old="w9", new="w2", ttl_ms=5000) == "w1"
    assert await store.move_session("s1", old="w1", new="w2", ttl_ms=5000) == "w2"
    assert await store.affinity_moves() == 1


async def test_events_and_loads_are_delivered(store: FleetStore) -> None:
    received: list[object] = []

    async def listen() -> None:
        async for item in store.listen():
            received.append(item)
            if len(received) == 2:
                return

    task = asyncio.create_task(listen())
    await asyncio.sleep(0.1)
    await store.publish_event(EventKind.READY, "w1")
    await store.publish_load(LoadReport(worker_id="w1"), ttl_ms=1000)
    await asyncio.wait_for(task, 5)
    assert isinstance(received[0], FleetEvent) and received[0].kind is EventKind.READY
    assert isinstance(received[1], LoadReport)


async def test_voices_round_trip(store: FleetStore) -> None:
    await store.put_voice(VoiceRecord(name="alice", bytes=4), b"RIFF")
    rec, audio = await store.get_voice("alice")
    assert rec.name == "alice" and audio == b"RIFF"
    assert [v.name for v in await store.list_voices()] == ["alice"]
    assert await store.delete_voice("alice") is True
    assert await store.get_voice("alice") is None


async def test_voice_quotas_keep_exact_usage(store: FleetStore) -> None:
    """Usage counters follow every put, replacement (also by another key) and delete, and a
    refused put changes nothing."""

    async def usage(owner: str = "") -> tuple[int, int]:
        return await store.voice_usage(owner)

    def voice(name: str, owner: str) -> VoiceRecord:
        return VoiceRecord(name=name, bytes=0, owner=owner)

    await store.put_voice(voice("a", "k1"), b"x" * 100, fleet_quota=250, key_quota=150)
    await store.put_voice(voice("b", "k2"), b"x" * 100, fleet_quota=250, key_quota=150)
    assert await usage("k1") == (200, 100)
    with pytest.raises(VoiceQuotaExceeded) as err:  # the fleet is full
        await store.put_voice(voice("c", "k3"), b"x" * 51, fleet_quota=250, key_quota=150)
    assert (err.value.scope, err.value.used, err.value.limit) == ("fleet", 200, 250)
    with pytest.raises(VoiceQuotaExceeded) as err:  # k1's own share is full
        await store.put_voice(voice("a", "k1"), b"x" * 151, fleet_quota=None, key_quota=150)
    assert err.value.scope == "key"
    assert await usage("k1") == (200, 100) and await store.get_voice("c") is None
    # another key may neither replace nor delete k1's voice; a caller without a key may
    with pytest.raises(VoiceOwnedByAnotherKey):
        await store.put_voice(voice("a", "k2"), b"x" * 40, fleet_quota=250, key_quota=150)
    with pytest.raises(VoiceOwnedByAnotherKey):
        await store.delete_voice("a", owner="k2")
    assert await usage("k1") == (200, 100)
    await store.put_voice(voice("a", ""), b"x" * 40, fleet_quota=250, key_quota=150)
    assert await usage("k1") == (140, 0) and await usage("k2") == (140, 100)
    # a voice without an owner may be taken over by any key, within its quota
    await store.put_voice(voice("a", "k2"), b"x" * 40, fleet_quota=250, key_quota=150)
    assert await usage("k2") == (140, 140)
    # voices stored before quotas (records without "owner") were never counted: replacing
    # or deleting one takes nothing from the counters
    for name in ("old1", "old2"):
        await store.redis.hset(store.keys.voices, name, f'{{"name": "{name}", "bytes": 5000}}')
        await store.redis.set(store.keys.voice_audio(name), b"y" * 5000)
    assert await store.delete_voice("old1") is True
    assert await usage("k2") == (140, 140)
    await store.put_voice(voice("old2", "k3"), b"x" * 10, fleet_quota=250, key_quota=150)
    assert await usage("k3") == (150, 10)
    assert await store.delete_voice("old2") is True
    assert await store.delete_voice("a") and await store.delete_voice("b")
    assert await usage("k2") == (0, 0)
    assert await store.redis.hlen(store.keys.voice_bytes_by_owner) == 0


def test_error_body_is_openai_shaped() -> None:
    body = error_body(404, ErrorCode.MODEL_NOT_FOUND, "no such model", param="model")
    assert body == {
        "error": {
            "message": "no such model",
            "type": "not_found_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


def test_redis_password_is_redacted() -> None:
    assert redacted_url("redis://:hunter2@h:6379/0") == "redis://***@h:6379/0"
    assert "hunter2" not in redacted_url("rediss://user:hunter2@h:6379")


async def test_plan_is_stored_once_by_digest_not_in_the_record(store: FleetStore) -> None:
    plan = {"spec": "tiny", "fits": True}
    for worker_id in ("w1", "w2"):  # two identical workers share one stored plan
        rec = record(worker_id).model_copy(update={"plan_digest": "abc", "plan": plan})
        await store.write_record(rec, ttl_ms=1000)
    raw = await store.redis.get(store.keys.worker("w1"))
    assert b'"plan"' not in raw and b'"plan_digest":"abc"' in raw
    assert await store.plans(["abc", "missing"]) == {"abc": plan}
    assert len(await store.redis.keys(store.keys.plan("*"))) == 1
    # Redis restarted empty: the heartbeat's rewrite brings the plan back too
    await store.redis.flushall()
    assert await store.heartbeat(rec, ttl_ms=1000) is False
    assert await store.plans(["abc"]) == {"abc": plan}
