"""How much Redis memory a fleet needs: measured on a private redis-server, not estimated.

Writes realistic records through ``FleetStore`` (a Qwen3-Omni worker on an 8-GPU node with its
full launch plan, a load report with all seven stages, session bindings with UUID keys, one
uploaded voice) and reads ``MEMORY USAGE`` per key and ``used_memory`` before and after.

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
from planner.plan import (
    GpuPlan,
    LaunchPlan,
    MemoryBudget,
    NodePlan,
    ProcessPlan,
    ReplicaPlan,
    StagePlacement,
)

GIB = 1024**3
STAGES = (
    "preprocessing",
    "image_encoder",
    "audio_encoder",
    "thinker",
    "decode",
    "talker",
    "code2wav",
)


def omni_plan(node: str) -> LaunchPlan:
    """Qwen3-Omni speech, default two-GPU layout, four replicas on 8xH100-80GB."""
    gpus = [
        GpuPlan(
            index=i,
            name="H100-80GB",
            capacity_bytes=80 * GIB,
            reserved_bytes=4 * GIB,
            by_stage={f"{i // 2}/{s}": MemoryBudget(weights=GIB, kv_cache=GIB) for s in STAGES[:4]},
            planned=MemoryBudget(weights=64 * GIB, kv_cache=8 * GIB, activations=GIB, runtime=GIB),
        )
        for i in range(8)
    ]
    processes, replicas = [], []
    for r in range(4):
        names = []
        for stage in STAGES:
            gpu = [] if stage in ("preprocessing", "decode") else [2 * r + (stage == "talker")]
            name = f"{r}/{stage}"
            names.append(name)
            processes.append(
                ProcessPlan(
                    name=name,
                    group=stage,
                    replica=r,
                    stages=[
                        StagePlacement(
                            stage=stage,
                            memory=MemoryBudget(weights=31 * GIB, kv_cache=8 * GIB),
                            kv_tokens=81920,
                            max_running_requests=64,
                            params=31_719_205_488,
                            kv_bytes_per_token=98_304,
                        )
                    ],
                    device="gpu" if gpu else "cpu",
                    gpus=gpu,
                    env={"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpu))},
                    memory_per_gpu=MemoryBudget(weights=31 * GIB, kv_cache=8 * GIB),
                    engine_fraction=0.85 if gpu else None,
                )
            )
        replicas.append(ReplicaPlan(index=r, gpus=[2 * r, 2 * r + 1], processes=names))
    return LaunchPlan(
        spec="qwen3-omni-speech",
        spec_digest="0" * 64,
        fits=True,
        nodes=[NodePlan(node=node, gpus=gpus, replicas=replicas, processes=processes)],
    )


def record(i: int) -> WorkerRecord:
    node = f"gpu-node-{i:04d}"
    plan = omni_plan(node)
    return WorkerRecord(
        id=f"omni-worker-{uuid.uuid4().hex[:5]}",
        url=f"http://10.{i // 250}.{i % 250}.7:8100",
        node=node,
        model="qwen3-omni-speech",
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
            f"(JSON {len(sync.get(store.keys.worker(some)))} B, plan included)"
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
