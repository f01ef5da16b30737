"""Qwen3-ASR: omni-worker vs the official ``qwen-asr`` package on the same tiny checkpoint.

    python bench/bench_asr.py [--requests 16] [--seconds 4] [--max-new-tokens 24]

The checkpoint is the equality tests' ``tiny-qwen3-asr-wide``, written by the official classes
(built in the reference venv if missing). The package transcribes one request at a time (one
``transcribe`` call per caller); the worker serves the same audio over HTTP at concurrency 1 and
``--concurrency``. Reported: audio seconds transcribed per wall second and the ratio. Prints a
table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.models import qwen3_tts_reference as ref  # noqa: E402
from tests.worker_procs import WorkerProcess  # noqa: E402

NAME = "tiny-qwen3-asr-wide"
SCRIPT = REPO / "tests" / "models" / "reference" / "qwen3_asr_official.py"


async def _throughput(url: str, wav: bytes, n: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient() as client:

        async def one() -> None:
            async with sem:
                r = await client.post(
                    url + "/v1/audio/transcriptions",
                    data={"model": "tiny-qwen3-asr"},
                    files={"file": ("a.wav", wav, "audio/wav")},
                    timeout=600,
                )
                r.raise_for_status()

        await one()  # warm-up
        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--official-result", help="reuse the package's JSON of an earlier run")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-asr-"))
    checkpoint = ref.official_checkpoints([NAME], tmp, SCRIPT)[NAME]
    t = np.arange(int(16_000 * args.seconds)) / 16_000
    samples = (0.4 * np.sin(2 * np.pi * (200 + 150 * t) * t)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, samples, 16_000, format="WAV", subtype="PCM_16")
    wav = buf.getvalue()
    np.save(tmp / "a.npy", sf.read(io.BytesIO(wav), dtype="float32")[0])
    if args.official_result:
        (tmp / "official.json").write_text(Path(args.official_result).read_text())
    else:
        job = {"cmd": "bench", "checkpoint": str(checkpoint), "audio": str(tmp / "a.npy"),
               "n": args.requests, "max_new_tokens": args.max_new_tokens,
               "out": str(tmp / "official.json")}  # fmt: skip
        ref.run_official([job], tmp, SCRIPT)
    official = json.loads((tmp / "official.json").read_text())
    spec = yaml.safe_load((REPO / "configs" / "models" / "tiny-qwen3-asr.yaml").read_text())
    spec["model_dir"] = str(checkpoint)
    spec["stages"]["asr"]["engine"]["max_new_tokens"] = args.max_new_tokens
    (tmp / "asr.yaml").write_text(yaml.safe_dump(spec))
    worker = WorkerProcess(
        "--spec", str(tmp / "asr.yaml"), "--gpus", "cpu", "--cache-dir", str(tmp)
    )
    try:
        worker.wait_ready(timeout=300)
        wall1 = asyncio.run(_throughput(worker.url, wav, args.requests, 1))
        wall = asyncio.run(_throughput(worker.url, wav, args.requests, args.concurrency))
    finally:
        worker.stop()
    seconds = args.requests * args.seconds
    theirs = official["audio_seconds"] / official["wall_seconds"]
    ours1, ours = seconds / wall1, seconds / wall
    result = {
        "requests": args.requests,
        "audio_seconds_each": args.seconds,
        "max_new_tokens": args.max_new_tokens,
        "official_audio_s_per_s": round(theirs, 2),
        "worker_c1_audio_s_per_s": round(ours1, 2),
        f"worker_c{args.concurrency}_audio_s_per_s": round(ours, 2),
        "speedup": round(ours / theirs, 2),
    }
    print(f"{'':34}audio s transcribed / wall s")
    print(f"{'qwen-asr, one at a time':34}{theirs:8.2f}")
    print(f"{'omni-worker, concurrency 1':34}{ours1:8.2f}")
    print(f"{f'omni-worker, concurrency {args.concurrency}':34}{ours:8.2f}  ({ours / theirs:.1f}x)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
