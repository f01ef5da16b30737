"""The worker of this tree against an earlier worker, on the tiny specs, over HTTP.

    python bench/bench_engines.py [--base bf360a0] [--rounds 2] [--only chat,tts,asr]

The base is the same worker at another commit (a git worktree of it under ``bench/results/``,
run with this environment's Python), by default ``bf360a0`` with its own torch engine under
every autoregressive stage (``--overrides <stage>.engine.backend=transformers``): the engine
that SGLang replaced. Both run in this environment (the same torch, transformers and SGLang)
with their own checkpoint caches. One worker runs at a time; each round starts the base's and
this tree's in turn (alternating which goes first), so a slow minute of the shared cores falls
on both. Workloads, all greedy:

- chat: tiny-omni text chat, 64 new tokens (``ignore_eos`` is not an API field: the replies are
  the checkpoint's greedy ones, equal on both engines), 16 requests at concurrency 1 and 32 at
  concurrency 8; completion tokens per wall second;
- tts: tiny-qwen3-tts speech, 8 replies of 64 frames at concurrency 4; audio seconds per wall
  second;
- asr: tiny-qwen3-asr transcription of a 4 s clip, 128 requests at concurrency 8 (after 16 to
  warm up; one request takes about 15 ms of the stage's core); requests per wall second.

Prints a table of medians over the rounds and their ratios (this tree / base), and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
SPECS = {"chat": "tiny-omni", "tts": "tiny-qwen3-tts", "asr": "tiny-qwen3-asr"}
TORCH_ENGINE = {  # the base's overrides: its torch engine under each autoregressive stage
    "tiny-omni": ["--overrides", "thinker.engine.backend=transformers",
                  "--overrides", "talker.engine.backend=transformers"],
    "tiny-qwen3-tts": ["--overrides", "tts_engine.engine.backend=transformers"],
    "tiny-qwen3-asr": ["--overrides", "asr.engine.backend=transformers"],
}  # fmt: skip


def worktree(commit: str) -> Path:
    """A checkout of ``commit`` beside the results (made once)."""
    path = REPO / "bench" / "results" / f"tree-{commit}"
    if not (path / "worker").is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), commit],
            check=True,
        )
    return path


class Worker:
    """``python -m worker.cli`` of a source tree (its own ``worker`` package first on the
    path), standalone (no Redis), on a free port."""

    def __init__(
        self, tree: Path, spec: str, args: list[str], cache: Path, spec_path: Path | None = None
    ) -> None:
        """``args``: more worker flags (``--overrides X``, ...); ``spec_path``: a spec file of
        its own (else the tree's ``configs/models/<spec>.yaml``)."""
        self.tree, self.spec, self.args, self.cache = tree, spec, args, cache
        self.spec_path = spec_path or tree / "configs" / "models" / f"{spec}.yaml"

    def __enter__(self) -> str:
        sys.path.insert(0, str(REPO))
        from fleet.redis_server import free_port

        port = free_port()
        self.log = Path(tempfile.mkstemp(prefix="bench-engines-", suffix=".log")[1])
        argv = [sys.executable, "-m", "worker.cli", "--port", str(port),
                "--spec", str(self.spec_path), "--cache-dir", str(self.cache),
                "--log-level", "warning", *self.args]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(self.tree)}
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, cwd=self.tree, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"worker exited {self.proc.returncode}; log: {self.log}")
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise SystemExit(f"worker not ready in 300 s; log: {self.log}")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def _closed_loop(n: int, concurrency: int, one: Callable[[int], Awaitable[float]]) -> float:
    """``n`` calls of ``one`` at most ``concurrency`` at a time: the sum of what they return
    per wall second."""
    sem = asyncio.Semaphore(concurrency)

    async def gated(i: int) -> float:
        async with sem:
            return await one(i)

    start = time.perf_counter()
    done = await asyncio.gather(*(gated(i) for i in range(n)))
    return sum(done) / (time.perf_counter() - start)


async def chat(url: str) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(i: int) -> float:
            r = await client.post(url + "/v1/chat/completions", json={
                "model": "tiny-omni", "max_tokens": 64, "temperature": 0,
                "messages": [{"role": "user", "content": f"Tell me about request {i}."}],
            })  # fmt: skip
            r.raise_for_status()
            return float(r.json()["usage"]["completion_tokens"])

        await _closed_loop(2, 2, one)  # warm
        return {
            "chat c=1 tokens/s": await _closed_loop(16, 1, one),
            "chat c=8 tokens/s": await _closed_loop(32, 8, one),
        }


async def tts(url: str) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(i: int) -> float:
            r = await client.post(url + "/v1/audio/speech", json={
                "model": "tiny-qwen3-tts", "input": f"Request number {i} of the benchmark.",
                "voice": ["eric", "ryan", "vivian"][i % 3], "response_format": "pcm",
                "temperature": 0,
            })  # fmt: skip
            r.raise_for_status()
            return len(r.content) / 2 / 24_000

        await _closed_loop(2, 2, one)
        return {"tts c=4 audio s/s": await _closed_loop(8, 4, one)}


def _clip(seconds: float = 4.0) -> bytes:
    rng = np.random.default_rng(0)
    t = np.arange(int(16_000 * seconds)) / 16_000
    wave = 0.3 * np.sin(2 * np.pi * 220 * t) + 0.02 * rng.standard_normal(t.size)
    buf = io.BytesIO()
    sf.write(buf, wave.astype(np.float32), 16_000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


async def asr(url: str) -> dict[str, float]:
    wav = _clip()
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(i: int) -> float:
            r = await client.post(url + "/v1/audio/transcriptions",
                                  data={"model": "tiny-qwen3-asr"},
                                  files={"file": ("a.wav", wav, "audio/wav")})  # fmt: skip
            r.raise_for_status()
            return 1.0

        await _closed_loop(16, 8, one)  # warm
        return {"asr c=8 requests/s": await _closed_loop(128, 8, one)}


WORKLOADS = {"chat": chat, "tts": tts, "asr": asr}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="bf360a0", help="the commit to compare with")
    p.add_argument("--base-overrides", choices=["torch-engine", "none"], default="torch-engine")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", default="chat,tts,asr")
    args = p.parse_args()
    base_tree = worktree(args.base)
    cache = REPO / "bench" / "results" / "engines-cache"
    sides = {
        "base": lambda spec: Worker(base_tree, spec, TORCH_ENGINE[spec]
                                    if args.base_overrides == "torch-engine" else [],
                                    cache / "base"),
        "this": lambda spec: Worker(REPO, spec, [], cache / "this"),
    }  # fmt: skip
    figures: dict[str, dict[str, list[float]]] = {"base": {}, "this": {}}
    for r in range(args.rounds):
        for name in args.only.split(","):
            order = ["base", "this"] if r % 2 == 0 else ["this", "base"]
            for side in order:
                with sides[side](SPECS[name]) as url:
                    got = asyncio.run(WORKLOADS[name](url))
                for key, value in got.items():
                    figures[side].setdefault(key, []).append(value)
                print(f"round {r + 1} {side}: {got}", file=sys.stderr, flush=True)
    print(f"\n| workload | base {args.base} | this tree | this / base |\n|---|---:|---:|---:|")
    out = {}
    for key in figures["this"]:
        b, t = statistics.median(figures["base"][key]), statistics.median(figures["this"][key])
        out[key] = {"base": b, "this": t, "ratio": t / b}
        print(f"| {key} | {b:.1f} | {t:.1f} | {t / b:.2f} |")
    print(json.dumps({"base": args.base, "rounds": args.rounds, "figures": out}))


if __name__ == "__main__":
    main()
