"""omni-worker over HTTP: time to first text token and first audio chunk at concurrency 1,
and throughput at concurrency 1 vs 8 (step batching should make 8 clearly faster in total).

    python bench/bench_worker_http.py                    # starts its own tiny-omni worker
    python bench/bench_worker_http.py --url http://127.0.0.1:8100 [--token T]

Run by hand on an otherwise idle machine; prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

REPO = Path(__file__).resolve().parents[1]


def start_worker(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    sys.path.insert(0, str(REPO))
    from fleet.redis_server import free_port

    port = free_port()
    log = open(tempfile.mkstemp(prefix="bench-worker-", suffix=".log")[1], "wb")  # noqa: SIM115
    argv = [
        sys.executable,
        "-m",
        "worker.cli",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--spec",
        args.spec,
        *(["--cache-dir", args.cache_dir] if args.cache_dir else []),
    ]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"worker exited {proc.returncode}; log: {log.name}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                print(f"worker ready at {url} (log {log.name})", file=sys.stderr)
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("worker not ready in 300s")


async def chat_stream(
    client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int, voice: str | None
) -> dict:
    body: dict = {
        "model": model,
        "stream": True,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": prompt}],
    }
    if voice:
        body |= {"modalities": ["text", "audio"], "audio": {"voice": voice, "format": "pcm16"}}
    started = time.perf_counter()
    first_text = first_audio = None
    tokens = 0
    audio_bytes = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                delta = choice["delta"]
                if delta.get("content") and first_text is None:
                    first_text = time.perf_counter() - started
                if (delta.get("audio") or {}).get("data"):
                    audio_bytes += len(base64.b64decode(delta["audio"]["data"]))
                    if first_audio is None:
                        first_audio = time.perf_counter() - started
    return {
        "ttft": first_text,
        "ttfa": first_audio,
        "tokens": tokens,
        "audio_s": audio_bytes / 2 / 24_000,
        "total": time.perf_counter() - started,
    }


async def speech_stream(client: httpx.AsyncClient, model: str, text: str, voice: str) -> dict:
    body = {"model": model, "input": text, "voice": voice, "response_format": "pcm", "stream": True}
    started = time.perf_counter()
    first = None
    size = 0
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        response.raise_for_status()
        async for piece in response.aiter_raw():
            if piece and first is None:
                first = time.perf_counter() - started
            size += len(piece)
    return {"ttfa": first, "audio_s": size / 2 / 24_000, "total": time.perf_counter() - started}


async def run(url: str, args: argparse.Namespace) -> dict:
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=600, limits=limits
    ) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        voices = (await client.get("/v1/audio/voices")).json()["data"]
        voice = next(v["name"] for v in voices if v["builtin"])
        prompt = "Describe the pipeline of an omni model in a few words."
        # warm-up: the first request pays for lazy initialisation in every stage
        await chat_stream(client, model, prompt, 4, voice)

        text_runs = [
            await chat_stream(client, model, prompt, args.max_tokens, None)
            for _ in range(args.reps)
        ]
        audio_chat = [
            await chat_stream(client, model, prompt, args.max_tokens, voice)
            for _ in range(args.reps)
        ]
        speech = [
            await speech_stream(client, model, "Hello from the omni fleet.", voice)
            for _ in range(args.reps)
        ]

        async def batch(concurrency: int, with_audio: bool) -> dict:
            jobs = args.requests

            async def one(i: int) -> dict:
                return await chat_stream(
                    client, model, f"{prompt} #{i}", args.max_tokens, voice if with_audio else None
                )

            gate = asyncio.Semaphore(concurrency)

            async def gated(i: int) -> dict:
                async with gate:
                    return await one(i)

            started = time.perf_counter()
            results = await asyncio.gather(*(gated(i) for i in range(jobs)))
            wall = time.perf_counter() - started
            return {
                "concurrency": concurrency,
                "requests": jobs,
                "wall_s": round(wall, 3),
                "req_per_s": round(jobs / wall, 3),
                "tokens_per_s": round(sum(r["tokens"] for r in results) / wall, 2),
                "audio_s_per_s": round(sum(r["audio_s"] for r in results) / wall, 3),
            }

        throughput = {
            f"{kind}_c{c}": await batch(c, kind == "audio")
            for kind in ("text", "audio")
            for c in (1, 8)
        }

    def med(rows: list[dict], key: str) -> float | None:
        values = [r[key] for r in rows if r[key] is not None]
        return round(statistics.median(values) * 1000, 1) if values else None

    return {
        "model": model,
        "c1_ttft_ms_chat_text": med(text_runs, "ttft"),
        "c1_ttft_ms_chat_audio": med(audio_chat, "ttft"),
        "c1_ttfa_ms_chat_audio": med(audio_chat, "ttfa"),
        "c1_ttfa_ms_speech": med(speech, "ttfa"),
        "c1_total_ms_speech": med(speech, "total"),
        "throughput": throughput,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an already running worker (default: start one)")
    parser.add_argument("--token", default=os.environ.get("OMNI_WORKER_TOKEN"))
    parser.add_argument("--spec", default="configs/models/tiny-omni.yaml")
    parser.add_argument("--cache-dir")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--requests", type=int, default=16, help="per throughput run")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    proc = None
    url = args.url
    if url is None:
        proc, url = start_worker(args)
    try:
        result = asyncio.run(run(url, args))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    print(f"model {result['model']} at {url}")
    for key, value in result.items():
        if key.startswith("c1_"):
            print(f"  {key:28s} {value}")
    for name, row in result["throughput"].items():
        print(
            f"  {name:10s} wall {row['wall_s']:7.2f}s  {row['req_per_s']:6.2f} req/s  "
            f"{row['tokens_per_s']:8.2f} tok/s  {row['audio_s_per_s']:6.3f} audio-s/s"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
