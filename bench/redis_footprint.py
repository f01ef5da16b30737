"""How much Redis memory a fleet needs: measured on a private redis-server, not estimated.

Writes realistic records through ``FleetStore`` (a Qwen3-Omni worker on an 8xH100 node with
the launch plan the planner makes for it, a load report with all seven stages, session bindings
with UUID keys, one uploaded voice) and reads ``MEMORY USAGE`` per key and ``used_memory``
before and after, and times one router resync (``FleetStore.snapshot``).

    python bench/redis_footprint.py [--workers 500] [--sessions 200000]

The numbers feed docs/multi-node.md ("what Redis holds and how big it gets").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import redis

from fleet.records import LoadReport, VoiceRecord, WorkerRecord
from fleet.redis_server import RedisServer
from fleet.store import FleetStore, connect
from planner.api import plan_spec

SPEC = "configs/models/qwen3-omni-30b-a3b-speech.yaml"
STAGES = (
    "preprocessing",
    "image_encoder",
    "audio_encoder",
    "thinker",
    "decode",
    "talker",
    "code2wav",
)
# The plan a worker on an 8xH100 node computes at start-up and puts in its record.
PLAN = plan_spec(SPEC, "8xH100-80GB").plan


def record(i: int) -> WorkerRecord:
    node = f"gpu-node-{i:04d}"
    plan = PLAN
    return WorkerRecord(
        id=f"omni-worker-{uuid.uuid4().hex[:5]}",
        url=f"http://10.{i // 250}.{i % 250}.7:8100",
        node=node,
        model="qwen3-omni-30b-a3b-speech",
        served_models=["Qwen/Qwen3-Omni-30B-A3B-Instruct", "qwen3-omni"],
        capacity=64,
        plan_digest=plan.digest(),
        plan=plan.model_dump(mode="json"),
    )


def load(worker_id: str) -> LoadReport:
    return LoadReport(
        worker_id=worker_id,
        in_flight=37,
        queue_depth={s: 12 for s in STAGES},
        busy={s: 0.731 for s in STAGES},
        active_sessions=412,
        ttft_ms=183.4,
        ttfa_ms=412.9,
    )


async def main(workers: int, sessions: int) -> None:
    with RedisServer() as server:
        sync = redis.Redis.from_url(server.url)
        store = FleetStore(connect(server.url), fleet="prod")
        base = sync.info("memory")["used_memory"]

        ids = []
        for i in range(workers):
            rec = record(i)
            ids.append(rec.id)
            await store.write_record(rec, ttl_ms=600_000)
            await store.publish_load(load(rec.id), ttl_ms=600_000)
        after_workers = sync.info("memory")["used_memory"]
        # What one router resync reads (every --resync-interval-s, per router process).
        timings = []
        for _ in range(5):
            t0 = time.perf_counter()
            views = await store.snapshot()
            timings.append(time.perf_counter() - t0)
        resync_bytes = sum(
            len(v.record.model_dump_json()) + len(v.load.model_dump_json() if v.load else "")
            for v in views.values()
        )

        batch = 10_000
        for start in range(0, sessions, batch):
            async with store.redis.pipeline(transaction=False) as pipe:
                for n in range(start, min(start + batch, sessions)):
                    key = store.keys.affinity(str(uuid.uuid4()))
                    pipe.set(key, ids[n % len(ids)], px=1_800_000)
                await pipe.execute()
        after_sessions = sync.info("memory")["used_memory"]

        audio = bytes(10 * 24_000 * 2)  # 10 s of 24 kHz 16-bit mono reference audio
        await store.put_voice(VoiceRecord(name="alice", bytes=len(audio)), audio)
        after_voice = sync.info("memory")["used_memory"]

        some = ids[0]
        session_key = next(sync.scan_iter(match=store.keys.affinity("*"), count=1000))
        print(
            f"redis-server {sync.info('server')['redis_version']}, "
            f"fleet prefix {store.keys.prefix!r}"
        )
        print(
            f"worker record   : {sync.memory_usage(store.keys.worker(some))} B "
            f"(JSON {len(sync.get(store.keys.worker(some)))} B)"
        )
        digest = PLAN.digest()
        print(
            f"launch plan     : {sync.memory_usage(store.keys.plan(digest))} B "
            f"(JSON {len(sync.get(store.keys.plan(digest)))} B, once per distinct plan)"
        )
        print(
            f"load report     : {sync.memory_usage(store.keys.load(some))} B "
            f"(JSON {len(sync.get(store.keys.load(some)))} B)"
        )
        print(f"session binding : {sync.memory_usage(session_key)} B")
        print(
            f"voice           : {sync.memory_usage(store.keys.voice_audio('alice'))} B audio "
            f"+ {len(sync.hget(store.keys.voices, 'alice'))} B metadata"
        )
        print(
            f"used_memory: empty {base / 1e6:.1f} MB; "
            f"+{workers} workers {(after_workers - base) / 1e6:.1f} MB "
            f"({(after_workers - base) / workers:.0f} B/worker); "
            f"+{sessions} sessions {(after_sessions - after_workers) / 1e6:.1f} MB "
            f"({(after_sessions - after_workers) / max(sessions, 1):.0f} B/session); "
            f"+1 voice {(after_voice - after_sessions) / 1e6:.2f} MB"
        )
        print(
            f"one resync of {len(views)} workers: {resync_bytes / 1e6:.1f} MB of JSON, "
            f"median {statistics.median(timings) * 1000:.0f} ms (client decode included)"
        )
        await store.close()
        sync.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=500)
    parser.add_argument("--sessions", type=int, default=200_000)
    args = parser.parse_args()
    asyncio.run(main(args.workers, args.sessions))
