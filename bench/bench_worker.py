"""Coordinator (no HTTP) on tiny-omni: time to first text token and to first audio chunk at
concurrency 1, and throughput at concurrency 1 vs 8 (step batching should make 8 clearly faster
in total).

    python bench/bench_worker.py [--requests 16] [--max-tokens 64] [--cache DIR] [--json]
    python bench/bench_worker.py --layouts # one process, the tiny layout, a process per stage

Run by hand on an otherwise idle machine. ``bench/bench_worker_http.py`` measures the same
through the HTTP API.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from planner.localplan import cpu_node_plan  # noqa: E402
from planner.spec import ModelSpec  # noqa: E402
from worker.contract.pipeline import (  # noqa: E402
    AUDIO_OUTPUT_RATE,
    AudioChunk,
    Finished,
    GenerationRequest,
    RequestKind,
    TextDelta,
)
from worker.daemon import coordinator_for  # noqa: E402
from worker.runtime.coordinator import Coordinator  # noqa: E402

SPEC = REPO / "configs" / "models" / "tiny-omni.yaml"
PROMPTS = ["Tell me a story.", "abc", "What is omni-fleet?", "hi"]  # long generations


async def one(eng: Coordinator, req: GenerationRequest) -> dict:
    t0 = time.perf_counter()
    out = {"first_text": None, "first_audio": None, "tokens": 0, "audio_s": 0.0}
    async for ev in eng.generate(req):
        now = time.perf_counter() - t0
        if isinstance(ev, TextDelta) and out["first_text"] is None:
            out["first_text"] = now
        elif isinstance(ev, AudioChunk):
            if out["first_audio"] is None:
                out["first_audio"] = now
            out["audio_s"] += len(ev.pcm16) / 2 / AUDIO_OUTPUT_RATE
        elif isinstance(ev, Finished):
            out["tokens"] = ev.completion_tokens
    out["total"] = time.perf_counter() - t0
    return out


def chat(i: int, max_tokens: int, audio: bool = False) -> GenerationRequest:
    msgs = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]
    return GenerationRequest(
        f"bench-{i}", RequestKind.CHAT, messages=msgs, max_tokens=max_tokens, output_audio=audio
    )


def speech(i: int) -> GenerationRequest:
    text = "The quick brown fox jumps over the lazy dog."
    return GenerationRequest(f"tts-{i}", RequestKind.SPEECH, text=text, voice="ethan")


async def run_at(eng: Coordinator, make, n: int, concurrency: int) -> tuple[float, list]:
    sem = asyncio.Semaphore(concurrency)

    async def guarded(i: int) -> dict:
        async with sem:
            return await one(eng, make(i))

    t0 = time.perf_counter()
    results = await asyncio.gather(*(guarded(i) for i in range(n)))
    return time.perf_counter() - t0, results


def ms(xs: list[float]) -> str:
    return f"p50 {1000 * statistics.median(xs):.1f} ms, max {1000 * max(xs):.1f} ms"


async def main(args: argparse.Namespace) -> dict:
    spec = ModelSpec.model_validate_json(json.dumps(__import__("yaml").safe_load(SPEC.read_text())))
    cache = Path(args.cache or tempfile.mkdtemp(prefix="omni-bench-"))
    eng = coordinator_for(spec, SPEC, cpu_node_plan(spec), cache)
    t0 = time.perf_counter()
    await eng.start(lambda _m: None)
    report: dict = {"startup_s": round(time.perf_counter() - t0, 2)}
    try:
        for i in range(3):  # warm the paths once
            await one(eng, chat(i, 8, audio=True))
        ttft = [(await one(eng, chat(i, 16)))["first_text"] for i in range(args.samples)]
        ttfa_chat = [
            (await one(eng, chat(i, 16, audio=True)))["first_audio"] for i in range(args.samples)
        ]
        ttfa_tts = [(await one(eng, speech(i)))["first_audio"] for i in range(args.samples)]
        report["c1_first_text_token_ms"] = round(1000 * statistics.median(ttft), 1)
        report["c1_first_audio_chat_ms"] = round(1000 * statistics.median(ttfa_chat), 1)
        report["c1_first_audio_speech_ms"] = round(1000 * statistics.median(ttfa_tts), 1)
        print(f"first text token (chat, c=1):        {ms(ttft)}")
        print(f"first audio chunk (chat+audio, c=1): {ms(ttfa_chat)}")
        print(f"first audio chunk (speech, c=1):     {ms(ttfa_tts)}")
        for label, make in (
            ("text", lambda i: chat(i, args.max_tokens)),
            ("text+audio", lambda i: chat(i, args.max_tokens // 2, audio=True)),
        ):
            row = {}
            for c in (1, 8):
                wall, res = await run_at(eng, make, args.requests, c)
                tokens = sum(r["tokens"] for r in res)
                audio = sum(r["audio_s"] for r in res)
                row[f"c{c}"] = {
                    "wall_s": round(wall, 3),
                    "tokens_per_s": round(tokens / wall, 1),
                    "audio_s_per_s": round(audio / wall, 2),
                    "req_per_s": round(len(res) / wall, 2),
                    "first_text_p50_ms": round(
                        1000 * statistics.median(r["first_text"] for r in res), 1
                    ),
                }
                print(
                    f"{label:10s} c={c}: {len(res)} requests in {wall:.2f} s, "
                    f"{tokens / wall:.0f} tok/s, {audio / wall:.1f} s audio/s, "
                    f"first text p50 {row[f'c{c}']['first_text_p50_ms']} ms"
                )
            row["speedup_c8_vs_c1"] = round(row["c1"]["wall_s"] / row["c8"]["wall_s"], 2)
            print(f"{label:10s} speed-up of c=8 over c=1: x{row['speedup_c8_vs_c1']}")
            report[label] = row
    finally:
        await eng.stop()
    return report


def _traffic(eng: Coordinator) -> tuple[int, int, int]:
    edges = eng.edge_traffic().values()
    return (
        sum(t.handed_over for t in edges),
        sum(t.serialised for t in edges),
        sum(t.bytes for t in edges),
    )


async def bench_layouts(args: argparse.Namespace) -> dict:
    """The same chat+audio requests on three process layouts of tiny-omni, one after another:
    the tiny spec's (talker and code2wav share a process), every stage but the thinker in one
    process (those edges handed over in place; the thinker and the talker each run an SGLang
    engine, one a process) and every stage in its own (every edge serialised)."""
    os.environ["OMNI_STAGE_THREADS"] = "1"  # the same threads per stage in every layout
    spec = ModelSpec.model_validate_json(json.dumps(__import__("yaml").safe_load(SPEC.read_text())))
    cache = Path(args.cache or tempfile.mkdtemp(prefix="omni-bench-"))
    stages = list(spec.stages)
    rest = [s for s in stages if s != "thinker"]
    layouts = {
        "tiny": None,
        "two-processes": {"thinker": ["thinker"], "rest": rest},
        "split": {s: [s] for s in stages},
    }
    report: dict = {}
    for name, groups in layouts.items():
        eng = coordinator_for(spec, SPEC, cpu_node_plan(spec, groups=groups), cache)
        await eng.start(lambda _m: None)
        try:
            for i in range(2):  # warm the paths once
                await one(eng, chat(i, 8, audio=True))
            await asyncio.sleep(0.5)  # every process reports its counters every 0.1 s
            before = _traffic(eng)
            ttfa = [
                (await one(eng, chat(i, 16, audio=True)))["first_audio"]
                for i in range(args.samples)
            ]
            make = lambda i: chat(i, args.max_tokens // 2, audio=True)  # noqa: E731
            wall, _ = await run_at(eng, make, args.requests, 4)
            await asyncio.sleep(0.5)
            handed, serialised, size = (b - a for a, b in zip(before, _traffic(eng), strict=True))
        finally:
            await eng.stop()
        n = args.samples + args.requests
        report[name] = {
            "processes": len(groups or spec.process_groups()),
            "first_audio_p50_ms": round(1000 * statistics.median(ttfa), 1),
            "c4_req_per_s": round(args.requests / wall, 2),
            "handed_over_per_request": round(handed / n, 1),
            "serialised_per_request": round(serialised / n, 1),
            "serialised_kib_per_request": round(size / n / 1024, 1),
        }
        print(f"{name:12s} {report[name]}")
    return report


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--cache", help="checkpoint cache dir (default: a fresh temp dir)")
    ap.add_argument("--json", action="store_true", help="print one JSON line at the end")
    ap.add_argument(
        "--layouts", action="store_true", help="compare process layouts (in-place handover) only"
    )
    args = ap.parse_args()
    result = asyncio.run(bench_layouts(args) if args.layouts else main(args))
    if args.json:
        print(json.dumps(result))
