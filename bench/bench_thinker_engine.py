"""The thinker's engine, measured over HTTP on tiny-omni text chat: SGLang's scheduler under the
worker against bare SGLang (``sglang.Engine``, its own processes, on the same checkpoint and
token ids, with the same platform and the vendor layer's patches: ``bare_sglang_speed``), plus
what the engine does beyond speed:

- speed: tokens/s and time to first token at concurrency 1 and 8 (16 requests of 64 tokens);
- prefix: time to first token of a prompt whose 1,400-token start was computed before (warm)
  against one whose start is new (cold);
- chunked prefill: the longest gap between the text deltas of four running streams while one
  1,800-token prompt is prefilled, against their median gap;
- spoken: a voice conversation's second turn (its first turn a long system prompt and a 10 s
  clip, answered with speech, then a short text turn), time to first audio when the first
  turn's prompt is cached (the clip's hidden states kept for the talker, the clip encoded
  once) against a cold one.

    python bench/bench_thinker_engine.py [--only speed|prefix|chunked|spoken] [--no-encoder-cache]

Run by hand on an otherwise idle machine (the worker, then bare SGLang); prints one JSON line
per part. ``bench/bench_engines.py`` compares the worker with an earlier one's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_worker_http import start_worker  # noqa: E402

SPEC = REPO / "configs" / "models" / "tiny-omni.yaml"
NEW_TOKENS = 64


def spec_with(tmp: Path, encoder_cache: bool = True, prefill_chunk: int | None = None) -> str:
    raw = yaml.safe_load(SPEC.read_text())
    raw["model_dir"] = str(REPO / "configs" / "hf" / "tiny-omni")
    if prefill_chunk is not None:
        raw["stages"]["thinker"]["engine"]["prefill_chunk_tokens"] = prefill_chunk
    if not encoder_cache:
        for encoder in ("audio_encoder", "image_encoder"):
            raw["stages"][encoder].setdefault("engine", {})["encoder_cache_bytes"] = 0
    path = tmp / "tiny-omni.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def prompt(i: int) -> str:
    return f"Describe the pipeline of an omni model, request {i}."


async def chat(
    client: httpx.AsyncClient,
    messages: list[dict],
    max_tokens: int,
    streaming: asyncio.Event | None = None,
    **extra: object,
) -> dict:
    """One streamed chat (``extra``: more body fields): when its text (or, spoken, its audio)
    came, its transcript, its usage. ``streaming`` is set once its tenth text delta came."""
    body = {
        "model": "tiny-omni",
        "stream": True,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
        "messages": messages,
        **extra,
    }
    started = time.perf_counter()
    stamps: list[float] = []
    first_audio, transcript, usage = None, "", {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            usage = chunk.get("usage") or usage
            for c in chunk.get("choices", []):
                audio = c["delta"].get("audio") or {}
                if audio.get("data") and first_audio is None:
                    first_audio = time.perf_counter() - started
                transcript += audio.get("transcript") or ""
                if c["delta"].get("content"):
                    stamps.append(time.perf_counter())
                    if streaming is not None and len(stamps) == 10:
                        streaming.set()
    return {
        "ttft": stamps[0] - started if stamps else None,
        "ttfa": first_audio,
        "stamps": stamps,
        "transcript": transcript,
        "tokens": usage.get("completion_tokens", 0),
        "prompt": usage.get("prompt_tokens", 0),
        "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0),
    }


async def speed_over_http(url: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await chat(client, [{"role": "user", "content": "warm up"}], 4)
        out = {}
        for c in (1, 8):
            gate = asyncio.Semaphore(c)

            async def one(i: int, gate: asyncio.Semaphore = gate) -> dict:
                async with gate:
                    return await chat(client, [{"role": "user", "content": prompt(i)}],
                                      NEW_TOKENS)  # fmt: skip

            started = time.perf_counter()
            rows = await asyncio.gather(*(one(i) for i in range(16)))
            wall = time.perf_counter() - started
            out[f"c{c}"] = {
                "tokens_per_s": round(sum(r["tokens"] for r in rows) / wall, 1),
                "ttft_ms_p50": round(statistics.median(r["ttft"] for r in rows) * 1000, 1),
            }
        return out


BARE = """
import asyncio, json, statistics, sys, time
from transformers import AutoTokenizer
import sglang
ck, prompts, new_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
tok = AutoTokenizer.from_pretrained(ck)
config = json.load(open(ck + "/config.json"))
ids = [list(tok.apply_chat_template([{"role": "user", "content": p}], tokenize=True,
                                    add_generation_prompt=True, return_dict=True)["input_ids"])
       for p in prompts]
engine = sglang.Engine(model_path=ck, device="cpu", dtype="float32", skip_tokenizer_init=True,
                       attention_backend="torch_native", sampling_backend="pytorch",
                       disable_overlap_schedule=True, context_length=2048,
                       max_running_requests=16, log_level="warning")
# as the worker's thinker: greedy, ending at the end of the turn
params = {"temperature": 0.0, "max_new_tokens": new_tokens,
          "stop_token_ids": [config["im_end_token_id"]]}
async def one(i, gate):
    async with gate:
        started = time.perf_counter(); first = None
        async for out in await engine.async_generate(input_ids=ids[i], sampling_params=params,
                                                     stream=True):
            if first is None:
                first = time.perf_counter() - started
        return first, out["meta_info"]["completion_tokens"]
async def main():
    await one(0, asyncio.Semaphore(1))
    res = {}
    for c in (1, 8):
        gate = asyncio.Semaphore(c); started = time.perf_counter()
        rows = await asyncio.gather(*(one(i, gate) for i in range(len(ids))))
        wall = time.perf_counter() - started
        res[f"c{c}"] = {"tokens_per_s": round(sum(n for _, n in rows) / wall, 1),
                        "ttft_ms_p50": round(statistics.median(f for f, _ in rows) * 1000, 1)}
    print("RESULT " + json.dumps(res))
asyncio.run(main())
engine.shutdown()
"""


def bare_sglang_speed(checkpoint: Path) -> dict:
    """sglang.Engine in processes of its own (tokenizer manager, scheduler, detokenizer), on the
    token ids the worker's chat template gives the same prompts. Its processes import SGLang
    afresh, so a ``sitecustomize`` loads it through the vendor layer in each (the platform's
    attention backend, the CPU decoder stack, every patch: what the worker runs)."""
    site = Path(tempfile.mkdtemp(prefix="bench-sglang-site-"))
    (site / "sitecustomize.py").write_text(
        "from worker.engines import sglang as vendor\nvendor.load()\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{site}:{REPO}"}
    prompts = json.dumps([prompt(i) for i in range(16)])
    out = subprocess.run(
        [sys.executable, "-c", BARE, str(checkpoint), prompts, str(NEW_TOKENS)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"bare SGLang failed:\n{out.stderr[-3000:]}")


def filler(words: int, seed: int) -> str:
    rng = random.Random(seed)
    vocab = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "omega",
        "audio",
        "image",
        "video",
        "token",
        "stage",
        "fleet",
        "router",
    ]
    return " ".join(rng.choice(vocab) for _ in range(words))


async def prefix(url: str) -> dict:
    """Warm against cold time to first token of a ~1,400-token system prompt."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await chat(client, [{"role": "user", "content": "warm up"}], 2)
        cold, warm, cached = [], [], []
        for k in range(5):
            system = {"role": "system", "content": filler(230, seed=k)}  # ~1,400 tokens
            first = await chat(client, [system, {"role": "user", "content": "first"}], 1)
            again = await chat(client, [system, {"role": "user", "content": "second"}], 1)
            cold.append(first["ttft"])
            warm.append(again["ttft"])
            cached.append(again["cached"])
        c, w = statistics.median(cold), statistics.median(warm)
        return {"cold_ttft_ms": round(c * 1000, 1), "warm_ttft_ms": round(w * 1000, 1),
                "warm_over_cold": round(w / c, 3), "cached_tokens": cached}  # fmt: skip


def _clip(seconds: float, seed: int) -> str:
    """A noisy tone as base64 16 kHz WAV (a clip of its own per seed)."""
    import base64
    import io

    import numpy as np
    import soundfile as sf

    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16_000)) / 16_000
    wav = 0.2 * np.sin(2 * np.pi * (150 + 40 * seed) * t) + 0.05 * rng.normal(size=t.size)
    buf = io.BytesIO()
    sf.write(buf, wav.astype(np.float32), 16_000, format="WAV", subtype="PCM_16")
    return base64.b64encode(buf.getvalue()).decode()


async def spoken_turn(client: httpx.AsyncClient, messages: list[dict]) -> dict:
    """One streamed greedy chat with speech out (``chat``'s figures)."""
    return await chat(client, messages, 8, temperature=0, modalities=["text", "audio"],
                      audio={"voice": "ethan", "format": "pcm16"})  # fmt: skip


async def spoken(url: str) -> dict:
    """A voice conversation's second turn: warm (the first turn cached) against cold."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        cold, warm, cached, prompts = [], [], [], []
        for k in range(5):
            system = {"role": "system", "content": filler(150, seed=100 + k)}
            clip = {"type": "input_audio", "input_audio": {"data": _clip(10.0, k), "format": "wav"}}
            first = [system, {"role": "user", "content": [clip]}]
            one = await spoken_turn(client, first)
            second = [*first, {"role": "assistant", "content": one["transcript"]},
                      {"role": "user", "content": "Say it again."}]  # fmt: skip
            two = await spoken_turn(client, second)
            # the same turn with another clip and system prompt: nothing of it cached
            other = {"type": "input_audio", "input_audio": {"data": _clip(10.0, 50 + k),
                                                            "format": "wav"}}  # fmt: skip
            fresh = [{"role": "system", "content": filler(150, seed=200 + k)},
                     {"role": "user", "content": [other]}, *second[2:]]  # fmt: skip
            three = await spoken_turn(client, fresh)
            warm.append(two["ttfa"])
            cold.append(three["ttfa"])
            cached.append(two["cached"])
            prompts.append(two["prompt"])
        c, w = statistics.median(cold), statistics.median(warm)
        return {"cold_ttfa_ms": round(c * 1000, 1), "warm_ttfa_ms": round(w * 1000, 1),
                "warm_over_cold": round(w / c, 3), "cached_tokens": cached,
                "prompt_tokens": prompts}  # fmt: skip


async def chunked(url: str) -> dict:
    """Four streams decode while one 1,800-token prompt is prefilled: the longest gap between
    their text deltas that overlaps the prefill (from the prompt's sending to its first token)
    against their median gap. The prompt is sent once every stream has its tenth delta, so
    that all four decode throughout (each runs 120 tokens, about half a second here)."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await chat(client, [{"role": "user", "content": "warm up"}], 2)
        streaming = [asyncio.Event() for _ in range(4)]
        running = [
            asyncio.create_task(chat(client, [{"role": "user", "content": prompt(i)}], 120, s))
            for i, s in enumerate(streaming)
        ]
        await asyncio.gather(*(s.wait() for s in streaming))
        sent = time.perf_counter()
        long = await chat(client, [{"role": "user", "content": filler(300, seed=99)}], 2)
        first_token = sent + long["ttft"]
        rows = await asyncio.gather(*running)
        pairs = [(a, b) for r in rows for a, b in zip(r["stamps"], r["stamps"][1:], strict=False)]
        during = [b - a for a, b in pairs if b > sent and a < first_token]
        still = sum(r["stamps"][-1] > first_token for r in rows)
        med, worst = statistics.median(b - a for a, b in pairs), max(during)
        return {"median_gap_ms": round(med * 1000, 2), "max_gap_ms": round(worst * 1000, 2),
                "max_over_median": round(worst / med, 2), "gaps_during_prefill": len(during),
                "streams_still_running_after": still, "long_prompt_tokens": long["prompt"],
                "long_prompt_ttft_ms": round(long["ttft"] * 1000, 1)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["speed", "prefix", "chunked", "spoken"])
    parser.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir()) / "omni-bench"))
    parser.add_argument(
        "--no-encoder-cache",
        action="store_true",
        help="encode every clip again (the encoders' engine.encoder_cache_bytes 0)",
    )
    parser.add_argument(
        "--prefill-chunk-tokens",
        type=int,
        help="the thinker's engine.prefill_chunk_tokens (default: the spec's)",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-thinker-"))
    parts = [args.only] if args.only else ["speed", "prefix", "chunked", "spoken"]
    spec = spec_with(tmp, not args.no_encoder_cache, args.prefill_chunk_tokens)
    proc, url = start_worker(argparse.Namespace(spec=spec, cache_dir=args.cache_dir))
    try:
        if "speed" in parts:
            result = asyncio.run(speed_over_http(url))
            print(json.dumps({"part": "speed", "engine": "worker", **result}))
        if "prefix" in parts:
            print(json.dumps({"part": "prefix", **asyncio.run(prefix(url))}))
        if "chunked" in parts:
            print(json.dumps({"part": "chunked", **asyncio.run(chunked(url))}))
        if "spoken" in parts:
            print(json.dumps({"part": "spoken", **asyncio.run(spoken(url))}))
    finally:
        proc.terminate()
        proc.wait(30)
    if "speed" in parts:
        checkpoint = next(Path(args.cache_dir).glob("tiny-omni-*"))
        print(json.dumps({"part": "speed", "engine": "bare sglang.Engine",
                          **bare_sglang_speed(checkpoint)}))  # fmt: skip


if __name__ == "__main__":
    main()
