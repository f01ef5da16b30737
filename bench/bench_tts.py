"""Qwen3-TTS: omni-worker vs the official ``qwen-tts`` package on the same tiny checkpoint.

    python bench/bench_tts.py [--requests 16] [--max-new-tokens 48] [--concurrency 8]

The checkpoint is the tiny CustomVoice one written by the official classes (the equality
tests' ``tiny-qwen3-tts-custom-voice``, built in the reference venv if missing). The package
runs its requests one at a time (it is a library: one ``generate_custom_voice`` call per
caller); the worker serves the same requests over HTTP at ``--concurrency``. Both produce the
same number of frames per request (greedy, no end-of-speech on random weights). The worker runs
with its talker on SGLang (the specs' backend) and on the project's torch engine, one after
the other. Reported: audio seconds per wall second for each, their ratio to the package's, and
the worker's time to the first audio packet (streamed pcm) at concurrency 1. The worker also
runs the same requests sampled as the checkpoint says (its default: talker and sub-talker at
temperature 0.9, top-k 50; each request seeded), where a request may end early: its audio
seconds are what it produced. Prints a table and one JSON line.
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

from tests.models import qwen3_tts_reference as ref  # noqa: E402
from tests.worker_procs import WorkerProcess  # noqa: E402

NAME = "tiny-qwen3-tts-custom-voice"


async def _one(client: httpx.AsyncClient, url: str, i: int, sampled: bool) -> float:
    body = {
        "model": "tiny-qwen3-tts",
        "input": f"Request number {i} of the benchmark.",
        "voice": ["eric", "ryan", "vivian"][i % 3],
        "language": "English",
        "response_format": "pcm",
        **({"seed": i} if sampled else {"temperature": 0}),
    }
    r = await client.post(url + "/v1/audio/speech", json=body, timeout=600)
    r.raise_for_status()
    return len(r.content) / 2 / 24_000


async def _throughput(
    url: str, n: int, concurrency: int, sampled: bool = False
) -> tuple[float, float]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient() as client:

        async def run(i: int) -> float:
            async with sem:
                return await _one(client, url, i, sampled)

        await _one(client, url, 999, sampled)  # warm-up
        t0 = time.perf_counter()
        seconds = sum(await asyncio.gather(*(run(i) for i in range(n))))
        return seconds, time.perf_counter() - t0


def _first_packet(url: str, tries: int = 5) -> list[float]:
    out = []
    for i in range(tries):
        body = {"model": "tiny-qwen3-tts", "input": f"first packet {i}", "voice": "vivian",
                "response_format": "pcm", "stream": True, "temperature": 0}  # fmt: skip
        t0 = time.perf_counter()
        first = None
        with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=600) as r:
            for chunk in r.iter_bytes():
                if chunk and first is None:
                    first = time.perf_counter() - t0
        out.append(first)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--official-result", help="reuse the package's JSON of an earlier run")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-tts-"))
    checkpoint = ref.official_checkpoints([NAME], tmp)[NAME]

    if args.official_result:
        official = json.loads(Path(args.official_result).read_text())
    else:
        ref.run_official(
            [{"cmd": "bench", "checkpoint": str(checkpoint), "n": args.requests,
              "max_new_tokens": args.max_new_tokens, "out": str(tmp / "official.json")}],
            tmp,
        )  # fmt: skip
        official = json.loads((tmp / "official.json").read_text())

    spec = ref.spec_for("tiny-qwen3-tts", checkpoint, tmp, args.max_new_tokens)
    theirs = official["audio_seconds"] / official["wall_seconds"]
    result: dict = {
        "requests": args.requests,
        "frames_per_request": args.max_new_tokens - 1,
        "official_audio_s_per_s": round(theirs, 3),
    }
    c = args.concurrency
    print(f"{'':40}audio s / wall s")
    print(f"{'qwen-tts, one at a time':40}{theirs:8.3f}")
    for backend in ("sglang", "transformers"):  # the talker on SGLang, on the project's engine
        worker = WorkerProcess("--spec", str(spec), "--gpus", "cpu", "--cache-dir", str(tmp),
                               "--tts_engine.engine.backend", backend)  # fmt: skip
        try:
            worker.wait_ready(timeout=300)
            first = _first_packet(worker.url)
            greedy = {n: asyncio.run(_throughput(worker.url, args.requests, n)) for n in (1, c)}
            sampled = {
                n: asyncio.run(_throughput(worker.url, args.requests, n, sampled=True))
                for n in (1, c)
            }
        finally:
            worker.stop()
        for n in (1, c):
            ours = greedy[n][0] / greedy[n][1]
            result[f"{backend}_c{n}_audio_s_per_s"] = round(ours, 3)
            result[f"{backend}_sampled_c{n}_audio_s_per_s"] = round(
                sampled[n][0] / sampled[n][1], 3
            )
            rate = sampled[n][0] / sampled[n][1]
            print(f"{f'talker on {backend}, concurrency {n}':40}{ours:8.3f}  "
                  f"({ours / theirs:.1f}x; sampled {rate:.3f})")  # fmt: skip
        result[f"{backend}_first_packet_ms_median"] = round(1000 * statistics.median(first), 1)
        print(f"first audio packet, talker on {backend} (streamed, c=1): "
              f"{result[f'{backend}_first_packet_ms_median']} ms median")  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
