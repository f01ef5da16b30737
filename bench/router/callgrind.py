#!/usr/bin/env python3
"""Instructions per request of omni-router snapshots, side by side (valgrind's callgrind).

CPU time on a shared 2-core box moves by 15 % between runs; an instruction count does not. Each
router runs under ``valgrind --tool=callgrind --instr-atstart=no`` in front of one fake worker
(../shared/bench/fake_worker.py); a sequential keep-alive client sends ``--warmup`` requests,
instrumentation is switched on for ``--requests`` more, then off. The count covers the user
space of every thread of the router process.

    bench/router/callgrind.py --router before=b26e7e0 --router after=HEAD --router work=.
    bench/router/callgrind.py --scenario speech --router after=HEAD

A router is a commit (exported with ``git archive`` into a temporary directory) or a source
directory (``.``: the working tree). Prints one line per router and scenario, then a JSON
summary.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HARNESS = Path(os.environ.get("HARNESS", ROOT.parent / "shared" / "bench"))
BODIES = {
    "chat": (
        "/v1/chat/completions",
        b'{"model":"fake-model","messages":[{"role":"user","content":"Say hello."}],'
        b'"max_tokens":16}',
    ),
    # the shared harness's chat body: a ~0.6 KB prompt (three blocks for the cache-aware policy)
    "chat-600": (
        "/v1/chat/completions",
        b'{"model":"fake-model","max_tokens":16,"messages":[{"role":"user","content":"Session '
        b"0001 asks: "
        + b"You are helping with a routing benchmark. Please answer the following question in "
        b"a couple of sentences, and keep the answer concise and polite. The question concerns "
        b"the scheduling of inference requests across several accelerator workers behind an "
        b"HTTP load balancer. " * 2 + b'"}]}',
    ),
    # 20 SSE events (the shared fake worker's default), chunked
    "stream": (
        "/v1/chat/completions",
        b'{"model":"fake-model","messages":[{"role":"user","content":"Say hello."}],'
        b'"max_tokens":16,"stream":true}',
    ),
    "speech": (
        "/v1/audio/speech",
        b'{"model":"fake-model","input":"Say hello.","voice":"alloy","response_format":"wav"}',
    ),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def snapshot(ref: str, into: Path) -> Path:
    """The router's source at ``ref``: a directory as it is ("." is the working tree), else
    the commit, exported."""
    if Path(ref).is_dir():
        return Path(ref).resolve()
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "router", "fleet"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def request(conn: http.client.HTTPConnection, path: str, body: bytes) -> int:
    conn.request("POST", path, body, {"content-type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    return resp.status


def wait_ready(port: int, path: str, body: bytes, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            if request(conn, path, body) == 200:
                conn.close()
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"router on port {port} not ready in {timeout:g}s")


def total_ir(out: Path) -> int:
    """Instructions in a callgrind output file (its ``totals:`` line)."""
    text = out.read_text()
    found = re.search(r"^totals: (\d+)", text, re.M)
    if found is None:
        raise ValueError(f"no totals in {out}")
    return int(found.group(1))


def measure(src: Path, scenario: str, requests: int, warmup: int, work: Path) -> float:
    path, body = BODIES[scenario]
    wport, rport = free_port(), free_port()
    worker = subprocess.Popen(
        [sys.executable, str(HARNESS / "fake_worker.py"), "--port", str(wport), "--name", "w1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    out = work / f"callgrind.{scenario}.{rport}.out"
    env = dict(os.environ, PYTHONPATH=str(src), PYTHONHASHSEED="0")
    router = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "router.cli",
            "--worker",
            f"http://127.0.0.1:{wport}",
            "--port",
            str(rport),
            "--log-level",
            "warning",
            "--probe-interval-s",  # time-driven work is not per-request work: valgrind is slow
            "3600",
        ],
        cwd=src,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_ready(rport, path, body, 300)
        conn = http.client.HTTPConnection("127.0.0.1", rport, timeout=60)
        for _ in range(warmup):
            assert request(conn, path, body) == 200
        subprocess.run(["callgrind_control", "-i", "on", str(router.pid)], check=True,
                       capture_output=True)  # fmt: skip
        for _ in range(requests):
            assert request(conn, path, body) == 200
        subprocess.run(["callgrind_control", "-i", "off", str(router.pid)], check=True,
                       capture_output=True)  # fmt: skip
        conn.close()
    finally:
        router.terminate()
        try:
            router.wait(120)
        except subprocess.TimeoutExpired:
            router.kill()
            router.wait()
        worker.terminate()
        worker.wait()
    files = sorted(work.glob(f"callgrind.{scenario}.{rport}.out*"))
    return sum(total_ir(f) for f in files) / requests


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--router", action="append", required=True, metavar="NAME=REF",
                   help="a name and a commit (or . for the working tree); repeatable")  # fmt: skip
    p.add_argument("--scenario", action="append", choices=sorted(BODIES), metavar="NAME",
                   help="chat (default) or speech (a 96 KB WAV body); repeatable")  # fmt: skip
    p.add_argument("--requests", type=int, default=1000, metavar="N")
    p.add_argument("--warmup", type=int, default=200, metavar="N")
    args = p.parse_args()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="omni-callgrind-") as tmp:
        work = Path(tmp)
        for spec in args.router:
            name, _, ref = spec.partition("=")
            src = snapshot(ref or name, work / f"src-{name}")
            for scenario in args.scenario or ["chat"]:
                ir = measure(src, scenario, args.requests, args.warmup, work)
                results.setdefault(name, {})[scenario] = ir
                print(f"{name:>12} {scenario:>7}: {ir / 1000:8.1f}k instructions/request",
                      flush=True)  # fmt: skip
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
