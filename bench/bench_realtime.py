"""Realtime voice sessions through omni-router: time to the first audio delta, at 1 and at 8
concurrent sessions, with the official ``openai`` SDK's realtime client.

Two figures per turn:
- ``response.create`` -> first ``response.output_audio.delta`` (a text turn: the user's item
  is created, then the response asked for);
- end of speech -> first audio delta, with server VAD: the session streams 20 ms events of
  speech-like audio at the pace a microphone would (silence, speech, silence) and the server
  decides when the turn ended; the figure includes the VAD's silence window
  (``--silence-ms``), which is printed beside it, and end of speech -> ``speech_stopped``.

    python bench/bench_realtime.py                       # own Redis, tiny-omni worker, router
    python bench/bench_realtime.py --sessions 1,8 --turns 4 --workers 1
    python bench/bench_realtime.py --router-url http://127.0.0.1:8000 --api-key sk-...

Run by hand (never from the test suite); prints the machine's state, a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleet.redis_server import RedisServer  # noqa: E402
from tests.fakes.procs import Router  # noqa: E402
from tests.realtime_client import (  # noqa: E402
    add_user_text,
    audio_session,
    read_response,
    sdk_client,
    silence_pcm,
    speech_pcm,
    stream_audio,
)
from tests.worker_procs import WorkerProcess  # noqa: E402

MODEL = "tiny-omni"


async def one_session(args: argparse.Namespace, url: str, index: int) -> dict[str, list[float]]:
    """One session: ``--turns`` text turns, then ``--turns`` spoken turns with server VAD."""
    out: dict[str, list[float]] = {"create_to_audio": [], "create_to_text": [], "eos_to_audio": []}
    out["eos_to_stopped"] = []
    client = sdk_client(url, args.api_key)
    session_id = f"bench-{uuid.uuid4().hex[:12]}"
    async with client.realtime.connect(
        model=args.model, extra_headers={"x-session-id": session_id}
    ) as conn:
        await conn.session.update(session=audio_session(max_output_tokens=args.max_tokens))
        for turn in range(args.turns):
            await add_user_text(conn, f"Turn {turn}: say hello.")
            sent = time.monotonic()
            await conn.response.create()
            r = await read_response(conn)
            if r.first_audio_at is None:
                raise SystemExit(f"session {index}: a response without audio ({r.status})")
            out["create_to_audio"].append(r.first_audio_at - sent)
            if r.first_text_at is not None:
                out["create_to_text"].append(r.first_text_at - sent)
        vad = {"type": "server_vad", "silence_duration_ms": args.silence_ms}
        await conn.session.update(session=audio_session(vad=vad, max_output_tokens=args.max_tokens))
        for turn in range(args.turns):
            speech = speech_pcm(args.speech_s, seed=index * 100 + turn)
            await stream_audio(conn, silence_pcm(0.3))
            speech_end = await stream_audio(conn, speech)
            # keep the microphone open (silence) while the server decides the turn ended
            trailing = asyncio.create_task(
                stream_audio(conn, silence_pcm(args.silence_ms / 1000 + 2))
            )
            r = await read_response(conn)
            await trailing
            if r.first_audio_at is None or r.speech_stopped_at is None:
                raise SystemExit(f"session {index}: spoken turn without audio: {r.events}")
            out["eos_to_audio"].append(r.first_audio_at - speech_end)
            out["eos_to_stopped"].append(r.speech_stopped_at - speech_end)
    return out


async def level(args: argparse.Namespace, url: str, sessions: int) -> dict[str, list[float]]:
    results = await asyncio.gather(*(one_session(args, url, i) for i in range(sessions)))
    merged: dict[str, list[float]] = {}
    for r in results:
        for name, values in r.items():
            merged.setdefault(name, []).extend(values)
    return merged


def summary(values: list[float]) -> dict[str, float | int]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}
    return {
        "n": len(ordered),
        "p50_ms": round(1000 * statistics.median(ordered), 1),
        "p90_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 1),
        "mean_ms": round(1000 * statistics.fmean(ordered), 1),
    }


def start_fleet(args: argparse.Namespace, stack: ExitStack) -> str:
    redis = stack.enter_context(RedisServer())
    workers = [
        WorkerProcess("--fleet", "bench-rt", redis_url=redis.url) for _ in range(args.workers)
    ]
    for w in workers:
        stack.callback(w.stop)
    for w in workers:
        w.wait_ready()
        print(f"worker ready at {w.url} (log {w.log_path})", file=sys.stderr)
    router = Router("--redis-url", redis.url, "--fleet", "bench-rt", name="bench-router")
    stack.callback(router.stop)
    deadline = time.monotonic() + 30
    while sum(w["routable"] for w in router.diagnostics()["workers"]) < args.workers:
        if time.monotonic() > deadline:
            raise SystemExit("the router never saw every worker")
        time.sleep(0.2)
    return router.url


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--router-url", help="an existing router (default: start a fleet here)")
    p.add_argument("--api-key", default=os.environ.get("OMNI_API_KEY", "none"))
    p.add_argument("--model", default=MODEL)
    p.add_argument("--workers", type=int, default=1, help="workers of the fleet started here")
    p.add_argument("--sessions", default="1,8", help="concurrency levels, comma separated")
    p.add_argument("--turns", type=int, default=3, help="text turns, then spoken turns")
    p.add_argument("--max-tokens", type=int, default=16, help="max_output_tokens per response")
    p.add_argument("--speech-s", type=float, default=1.2, help="seconds of speech per turn")
    p.add_argument("--silence-ms", type=int, default=500, help="server VAD silence_duration_ms")
    args = p.parse_args()
    machine = {
        "cpus": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
        "workers": args.workers if not args.router_url else None,
        "max_output_tokens": args.max_tokens,
        "silence_duration_ms": args.silence_ms,
    }
    with ExitStack() as stack:
        url = args.router_url or start_fleet(args, stack)
        asyncio.run(level(args, url, 1))  # warm-up: first requests compile and fill caches
        results = {}
        for n in (int(x) for x in args.sessions.split(",")):
            t0 = time.monotonic()
            values = asyncio.run(level(args, url, n))
            results[n] = {k: summary(v) for k, v in values.items()}
            results[n]["wall_s"] = round(time.monotonic() - t0, 1)  # type: ignore[assignment]
    machine["loadavg_after"] = os.getloadavg()
    print(f"\nmachine: {machine}")
    print(
        "\n| sessions | create -> 1st audio p50 / p90 | create -> 1st text p50 | "
        "end of speech -> 1st audio p50 / p90 | end of speech -> speech_stopped p50 | turns |"
    )
    print("|---|---|---|---|---|---|")
    for n, r in results.items():
        a, t, e, s = (
            r["create_to_audio"],
            r["create_to_text"],
            r["eos_to_audio"],
            r["eos_to_stopped"],
        )
        print(
            f"| {n} | {a.get('p50_ms')} / {a.get('p90_ms')} ms | {t.get('p50_ms')} ms "
            f"| {e.get('p50_ms')} / {e.get('p90_ms')} ms | {s.get('p50_ms')} ms "
            f"| {a['n']} + {e['n']} |"
        )
    print(json.dumps({"machine": machine, "results": results}))


if __name__ == "__main__":
    main()
