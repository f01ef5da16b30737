"""The staged Qwen3-Omni pipeline against transformers' own ``generate``, in one run (by hand):

    python bench/bench_qwen3_omni.py [--requests 32] [--concurrency 8] [--max-tokens 24]

1. A real ``omni-worker`` (tiny-omni, CPU, every stage group in its own process) serves chat
   requests with speech output (greedy: every run does the same work) at concurrency 1 and at
   the given concurrency: requests/s and audio seconds/s.
2. One streamed request: when its first audio chunk arrives against when its last text delta
   arrives (the thinker's end): streaming edges put audio out while the thinker still writes.
3. The worker stops; ``Qwen3OmniMoeForConditionalGeneration.generate`` on the same checkpoint
   runs the same requests one at a time (greedy talker, the same token limits).
Figures go to docs/omni-worker.md. Compare ratios from one run: the machine is noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "configs" / "models" / "tiny-omni.yaml"
RATE = 24_000


def prompts(n: int) -> list[str]:
    return [f"Question number {i}: tell me something about the number {i * 7}." for i in range(n)]


def body(prompt: str, max_tokens: int, stream: bool = False) -> dict:
    return {
        "model": "tiny-omni",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "modalities": ["text", "audio"],
        "audio": {"voice": "ethan", "format": "pcm16"},
        "stream": stream,
    }


async def staged(url: str, texts: list[str], concurrency: int, max_tokens: int) -> tuple:
    sem = asyncio.Semaphore(concurrency)
    audio_s = 0.0

    async def one(client: httpx.AsyncClient, prompt: str) -> None:
        nonlocal audio_s
        async with sem:
            r = await client.post(url + "/v1/chat/completions", json=body(prompt, max_tokens))
            r.raise_for_status()
            pcm = base64.b64decode(r.json()["choices"][0]["message"]["audio"]["data"])
            audio_s += len(pcm) / 2 / RATE

    async with httpx.AsyncClient(timeout=600) as client:
        await one(client, "warm up")
        audio_s = 0.0
        t0 = time.perf_counter()
        await asyncio.gather(*(one(client, p) for p in texts))
        return time.perf_counter() - t0, audio_s


def streamed(url: str, max_tokens: int) -> tuple[float, float]:
    """(first audio chunk, last text delta) in seconds after the request was sent."""
    first_audio = last_text = None
    t0 = time.perf_counter()
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json=body("Stream it.", max_tokens, True), timeout=600
    ) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"] if "choices" in line else {}
            now = time.perf_counter() - t0
            if delta.get("audio", {}).get("data") and first_audio is None:
                first_audio = now
            if delta.get("content") or delta.get("audio", {}).get("transcript"):
                last_text = now
    return first_audio or float("nan"), last_text or float("nan")


def reference(checkpoint: Path, texts: list[str], max_tokens: int, talker_max: int) -> tuple:
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from worker.models.qwen3_omni.processor import OmniProcessor

    proc = OmniProcessor(checkpoint)
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32)
    im_end = json.loads((checkpoint / "config.json").read_text())["im_end_token_id"]
    audio_s = 0.0
    t0 = time.perf_counter()
    for prompt in texts:
        ids = proc.prepare([{"role": "user", "content": prompt}]).input_ids
        _, wav = model.generate(
            input_ids=torch.tensor([ids]),
            speaker="ethan",
            thinker_max_new_tokens=max_tokens,
            thinker_eos_token_id=im_end,
            talker_do_sample=False,
            talker_max_new_tokens=talker_max,
        )
        audio_s += wav.numel() / RATE
    return time.perf_counter() - t0, audio_s


def serve(cache: Path, port: int) -> subprocess.Popen:
    """A worker on tiny-omni, ready."""
    log = open(cache / "worker.log", "wb")  # noqa: SIM115 - lives as long as the worker
    worker = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "--spec", str(SPEC), "--gpus", "cpu",
         "--port", str(port), "--cache-dir", str(cache)],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**os.environ},
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                return worker
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or worker.poll() is not None:
            worker.kill()
            raise SystemExit(log.name + ":\n" + Path(log.name).read_text()[-3000:])
        time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--reference-requests", type=int, default=8)
    args = ap.parse_args()
    import yaml

    talker_max = yaml.safe_load(SPEC.read_text())["stages"]["talker"]["engine"]["max_new_tokens"]
    cache = Path(tempfile.mkdtemp(prefix="omni-bench-"))
    port = 18_700
    url = f"http://127.0.0.1:{port}"
    texts = prompts(args.requests)
    staged_rps = 0.0
    worker = serve(cache, port)
    try:
        for c in (1, args.concurrency):
            wall, audio = asyncio.run(staged(url, texts, c, args.max_tokens))
            staged_rps = args.requests / wall
            print(f"c={c}: {args.requests} requests in {wall:.1f} s = "
                  f"{staged_rps:.2f} req/s, {audio / wall:.2f} audio s/s")  # fmt: skip
        first_audio, last_text = streamed(url, 48)
        print(
            f"streamed request: first audio at {first_audio * 1000:.0f} ms, last text delta at "
            f"{last_text * 1000:.0f} ms"
        )
    finally:
        worker.terminate()
        worker.wait(60)
    (checkpoint,) = [p for p in cache.iterdir() if p.is_dir() and p.name.startswith("tiny-omni")]
    ref_texts = texts[: args.reference_requests]
    ref_wall, ref_audio = reference(checkpoint, ref_texts, args.max_tokens, talker_max)
    ref_rps = len(ref_texts) / ref_wall
    print(f"generate, one at a time: {len(ref_texts)} requests in {ref_wall:.1f} s = "
          f"{ref_rps:.2f} req/s, {ref_audio / ref_wall:.2f} audio s/s")  # fmt: skip
    print(f"ratio (the worker at c={args.concurrency}): "
          f"{staged_rps / ref_rps:.1f}x requests/s")  # fmt: skip


if __name__ == "__main__":
    main()
