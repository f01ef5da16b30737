"""Qwen3-TTS on one worker: replies of increasing length, whole and streamed, by hand.

    python bench/bench_tts.py [--lengths 64 200 400] [--requests 8] [--concurrency 4]
                              [--base bf360a0] [--official]
                              [--checkpoint tiny-qwen3-tts-custom-voice-wide]

The checkpoint is a tiny CustomVoice one written by the official classes (the equality tests'
``tiny-qwen3-tts-custom-voice`` or, with ``--checkpoint``, its ``-wide`` sibling; built in the
reference venv if missing), served by the
``tiny-qwen3-tts`` spec with ``max_new_tokens`` set to each length (greedy: no end-of-speech
on random weights, so every reply has ``length - 1`` frames, 80 ms each). For each length the
worker serves ``--requests`` replies at concurrency 1 and ``--concurrency``:

- whole: ``response_format: pcm`` read at once; audio seconds per wall second;
- streamed: ``stream: true``; audio seconds per wall second and the median time to the first
  audio bytes.

``--base COMMIT`` also serves each length from the worker of an earlier commit (a worktree of
it, in this environment: ``bench_engines.Worker``), the two one after the other; ``--official``
runs the official ``qwen-tts`` package on the same requests one at a time (a library: one
``generate_custom_voice`` call per caller) at the first length, for its audio seconds per wall
second. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "bench"))

from bench_engines import Worker, worktree  # noqa: E402

from tests.models import qwen3_tts_reference as ref  # noqa: E402

NAME = "tiny-qwen3-tts-custom-voice"
CHECKPOINTS = [NAME, f"{NAME}-wide"]


async def _one(client: httpx.AsyncClient, url: str, i: int, stream: bool) -> tuple[float, float]:
    """One greedy reply: (its audio seconds, seconds to its first audio bytes)."""
    body = {"model": "tiny-qwen3-tts", "input": f"Request number {i} of the benchmark.",
            "voice": ["eric", "ryan", "vivian"][i % 3], "language": "English",
            "response_format": "pcm", "temperature": 0, "stream": stream}  # fmt: skip
    t0 = time.perf_counter()
    first, size = None, 0
    async with client.stream("POST", url + "/v1/audio/speech", json=body, timeout=600) as r:
        r.raise_for_status()
        async for chunk in r.aiter_bytes():
            if chunk and first is None:
                first = time.perf_counter() - t0
            size += len(chunk)
    return size / 2 / 24_000, first or 0.0


async def _run(url: str, n: int, concurrency: int, stream: bool) -> dict[str, float]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient() as client:

        async def gated(i: int) -> tuple[float, float]:
            async with sem:
                return await _one(client, url, i, stream)

        await _one(client, url, 999, stream)  # warm-up
        t0 = time.perf_counter()
        done = await asyncio.gather(*(gated(i) for i in range(n)))
        wall = time.perf_counter() - t0
    return {
        "audio_s_per_s": sum(s for s, _ in done) / wall,
        "first_audio_ms": 1000 * statistics.median(f for _, f in done),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 200, 400])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--base", help="also serve each length from the worker of this commit")
    ap.add_argument("--official", action="store_true", help="also run the qwen-tts package")
    ap.add_argument("--checkpoint", default=NAME, choices=CHECKPOINTS,
                    help="which tiny CustomVoice checkpoint (the wide one: wider and deeper "
                    "talker, code predictor and vocoder)")  # fmt: skip
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-tts-"))
    checkpoint = ref.official_checkpoints([args.checkpoint], tmp)[args.checkpoint]
    trees = {"this": REPO}
    if args.base:
        trees[f"base {args.base}"] = worktree(args.base)
    result: dict = {"requests": args.requests, "rows": []}
    print(f"{'worker':14} {'frames':>6} {'c':>2} {'mode':8} {'audio s/s':>10} {'first ms':>9}")
    for length in args.lengths:
        for side, tree in trees.items():
            # each tree's own spec (its stages' processes, streaming and batching)
            side_tmp = tmp / side.replace(" ", "-")
            side_tmp.mkdir(exist_ok=True)
            spec = ref.spec_for("tiny-qwen3-tts", checkpoint, side_tmp, length, tree=tree)
            worker = Worker(tree, "tiny-qwen3-tts", ["--gpus", "cpu"], tmp / side, spec)
            with worker as url:
                for c in (1, args.concurrency):
                    for stream in (False, True):
                        got = asyncio.run(_run(url, args.requests, c, stream))
                        mode = "streamed" if stream else "whole"
                        row = {"worker": side, "frames": length - 1, "concurrency": c,
                               "mode": mode, **got}  # fmt: skip
                        result["rows"].append(row)
                        speed, first = got["audio_s_per_s"], got["first_audio_ms"]
                        print(f"{side:14} {length - 1:>6} {c:>2} {mode:8} {speed:>10.2f} "
                              f"{first:>9.0f}")  # fmt: skip
    if args.official:
        out = tmp / "official.json"
        job = {"cmd": "bench", "checkpoint": str(checkpoint), "n": args.requests,
               "max_new_tokens": args.lengths[0], "out": str(out)}  # fmt: skip
        ref.run_official([job], tmp)
        official = json.loads(out.read_text())
        theirs = official["audio_seconds"] / official["wall_seconds"]
        result["official_audio_s_per_s"] = theirs
        print(f"qwen-tts, {args.lengths[0] - 1} frames, one at a time: {theirs:.2f} audio s/s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
