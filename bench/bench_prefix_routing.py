"""Cache-aware routing measured on a real local fleet: ``omni-router --local-workers 3`` on
tiny-omni (SGLang under each thinker), one policy after the other, the same stateless clients:

- text: six conversations, each with its own ~800-token system prompt, four turns each, no
  session id (every turn resends the whole conversation);
- audio: three conversations whose first turn carries a one-second clip (each its own), three
  turns each.

Per policy: the follow-up turns whose ``cached_tokens`` cover at least 70 % of their prompt,
the mean cached share, requests per worker, and the follow-ups' median latency.

    python bench/bench_prefix_routing.py [--policies cache_aware,load]

Run by hand on an otherwise idle machine; prints one JSON line per policy.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleet.redis_server import free_port  # noqa: E402

MODEL = "tiny-omni"
RULE = "Answer in one short sentence and never repeat the question. "


def clip_b64(freq: float) -> str:
    t = np.arange(16_000) / 16_000
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), 16_000, format="WAV")
    return base64.b64encode(buf.getvalue()).decode()


def turns(client: httpx.Client, opening: list[dict], n: int, salt: str) -> list[dict]:
    messages = list(opening)
    out = []
    for t in range(n):
        messages.append({"role": "user", "content": f"Turn {t} of {salt}: what follows?"})
        started = time.perf_counter()
        r = client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": messages, "max_tokens": 4, "temperature": 0},
        )
        r.raise_for_status()
        doc = r.json()
        usage = doc["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        out.append({
            "worker": r.headers["x-omni-worker-id"],
            "share": cached / usage["prompt_tokens"],
            "prompt_tokens": usage["prompt_tokens"],
            "ms": 1000 * (time.perf_counter() - started),
        })  # fmt: skip
        messages.append({"role": "assistant", "content": doc["choices"][0]["message"]["content"]})
    return out


def start_fleet(policy: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "router.cli", "--local-workers", "3", "--port", str(port),
         "--policy", policy, "--log-level", "warning"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if "local fleet ready" in line:
            return proc, f"http://127.0.0.1:{port}"
    raise RuntimeError(f"the local fleet did not start (exit {proc.wait()})")


def measure(policy: str) -> dict:
    proc, url = start_fleet(policy)
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            systems = [f"You are agent {n}. " + RULE * 13 for n in range(6)]
            talks = [
                turns(client, [{"role": "system", "content": system}], 4, f"c{n}")
                for n, system in enumerate(systems)
            ]
            openings = []
            for n in range(3):  # each its own clip
                audio = {"type": "input_audio", "input_audio": {"data": clip_b64(220.0 + 110 * n)}}
                ask = [audio, {"type": "text", "text": f"{n}: " + RULE * 5}]
                openings.append(
                    [{"role": "user", "content": ask}, {"role": "assistant", "content": "Ok."}]
                )
            heard = [turns(client, opening, 3, f"a{n}") for n, opening in enumerate(openings)]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)

    def part(convs: list[list[dict]]) -> dict:
        follow = [t for c in convs for t in c[1:]]
        return {
            "follow_ups": len(follow),
            "cached_70pct": sum(t["share"] >= 0.7 for t in follow),
            "mean_cached_share": round(statistics.mean(t["share"] for t in follow), 3),
            "follow_up_p50_ms": round(statistics.median(t["ms"] for t in follow), 1),
            "per_worker": dict(sorted(Counter(t["worker"] for c in convs for t in c).items())),
        }

    return {"policy": policy, "text": part(talks), "audio": part(heard)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="cache_aware,load")
    args = ap.parse_args()
    for policy in args.policies.split(","):
        print(json.dumps(measure(policy)), flush=True)


if __name__ == "__main__":
    main()
