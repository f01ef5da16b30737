"""Hostile but legitimate inputs against one worker (issue 13, worker side): for each, the
worker's answer, the peak RSS of the worker's HTTP process and of Redis while it ran, and
whether another client (a small chat, in a loop) was served meanwhile and the worker's Redis
record stayed alive.

    python bench/hostile_worker.py          # starts Redis and a tiny-omni worker of its own
    python bench/hostile_worker.py --url http://127.0.0.1:8100 --worker-pid PID \\
        --redis-url redis://127.0.0.1:6379 --redis-pid PID [--fleet default] [--token T]

Bounded: the largest input is 31 MB, every loop has a count. Run by hand; prints a table.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleet.keys import FleetKeys  # noqa: E402
from fleet.redis_server import RedisServer, free_port  # noqa: E402

MODEL = "tiny-omni"


# -- inputs --------------------------------------------------------------------------------------


def silent_flac(seconds: int, rate: int, channels: int) -> bytes:
    """The issue's bomb: silence compresses to ~1.5 KB per second at any rate and width."""
    buf = io.BytesIO()
    block = np.zeros((rate, channels), dtype=np.int16)
    with sf.SoundFile(buf, "w", rate, channels, format="FLAC", subtype="PCM_16") as out:
        for _ in range(seconds):
            out.write(block)
    return buf.getvalue()


def big_wav(megabytes: float) -> bytes:
    """A plain wav of about ``megabytes`` (8 channels of 48 kHz pcm16 noise)."""
    frames = int(megabytes * 2**20 / 16)
    noise = np.random.default_rng(0).integers(-3000, 3000, (frames, 8), dtype=np.int16)
    buf = io.BytesIO()
    sf.write(buf, noise, 48_000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def short_wav(seconds: float = 3.0) -> bytes:
    t = np.arange(int(seconds * 16_000)) / 16_000
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16_000, format="WAV")
    return buf.getvalue()


# -- measuring -----------------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@dataclass
class Watch:
    """Samples RSS every 20 ms, and keeps a small chat running (one at a time) with its own
    client, while a scenario runs; also checks the worker's Redis record is there."""

    url: str
    headers: dict[str, str]
    worker_pid: int
    redis_pid: int
    redis_url: str
    record_key: str
    peak_worker: float = 0.0
    peak_redis: float = 0.0
    served: int = 0
    failed: int = 0
    slowest_s: float = 0.0
    record_missing: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_worker = max(self.peak_worker, rss_mb(self.worker_pid))
            self.peak_redis = max(self.peak_redis, rss_mb(self.redis_pid))
            time.sleep(0.02)

    def _canary(self) -> None:
        import redis

        r = redis.Redis.from_url(self.redis_url)
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.Client(headers=self.headers, timeout=30) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    ok = client.post(self.url + "/v1/chat/completions", json=body).is_success
                except httpx.HTTPError:
                    ok = False
                self.slowest_s = max(self.slowest_s, time.monotonic() - started)
                self.served += ok
                self.failed += not ok
                if not r.exists(self.record_key):
                    self.record_missing += 1
                time.sleep(0.05)

    def run(self, scenario: Callable[[], str]) -> str:
        threads = [threading.Thread(target=f, daemon=True) for f in (self._sample, self._canary)]
        for t in threads:
            t.start()
        time.sleep(0.3)  # the canary is served at least once before the hostile input
        try:
            return scenario()
        finally:
            time.sleep(0.3)
            self._stop.set()
            for t in threads:
                t.join(timeout=35)


# -- scenarios -----------------------------------------------------------------------------------


def answer(response: httpx.Response) -> str:
    if response.is_success:
        return f"{response.status_code}"
    try:
        return f"{response.status_code} {response.json()['error']['code']}"
    except Exception:
        return f"{response.status_code} {response.text[:40]!r}"


def scenarios(url: str, headers: dict[str, str]) -> list[tuple[str, Callable[[], str]]]:
    client = httpx.Client(base_url=url, headers=headers, timeout=120)

    def transcribe(data: bytes) -> str:
        files = {"file": ("a.flac", data)}
        return answer(client.post("/v1/audio/transcriptions", data={"model": MODEL}, files=files))

    def chat_audio(data: bytes) -> str:
        part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode()}}
        content = [{"type": "text", "text": "hi"}, part]
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": content}]}
        return answer(client.post("/v1/chat/completions", json=body))

    def prompt(megabytes: int) -> str:
        text = "word " * (megabytes * 2**20 // 5)
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
        return answer(client.post("/v1/chat/completions", json=body))

    def voices(data: bytes, count: int, prefix: str) -> str:
        out = []
        for i in range(count):
            files = {"file": ("v.wav", data)}
            out.append(answer(client.post("/v1/audio/voices", data={"name": f"{prefix}{i}"},
                                          files=files)))  # fmt: skip
        for i in range(count):
            client.delete(f"/v1/audio/voices/{prefix}{i}")
        return ", ".join(sorted(set(out), key=out.index)) + f" (x{count})"

    def voice_quota() -> str:
        data = short_wav(29.0)  # 1.4 MB stored each; the default fleet quota holds 182
        seen: dict[str, int] = {}
        for i in range(200):
            a = answer(client.post("/v1/audio/voices", data={"name": f"q{i}"},
                                   files={"file": ("v.wav", data)}))  # fmt: skip
            seen[a] = seen.get(a, 0) + 1
            if a.startswith("429"):
                break
        for i in range(200):
            client.delete(f"/v1/audio/voices/q{i}")
        return ", ".join(f"{k} x{v}" for k, v in seen.items())

    host, port = url.split("//", 1)[1].rsplit(":", 1)

    def gone_mid_body(count: int) -> str:
        for _ in range(count):
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                head = (
                    "POST /v1/audio/voices HTTP/1.1\r\nHost: w\r\n"
                    "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 1000000\r\n"
                    + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                    + "\r\n"
                )
                sock.sendall(head.encode() + b"--b\r\n" + b"a" * 10_000)
        return f"{count} connections closed mid-body"

    def malformed(count: int) -> str:
        replies = set()
        for _ in range(count):
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nNo colon here\r\n\r\n")
                reply = sock.recv(65536)
            kind = "json" if b"application/json" in reply else "not json"
            replies.add(reply.split(b"\r\n", 1)[0].decode(errors="replace") + f" ({kind})")
        return ", ".join(sorted(replies))

    def huge_head(kind: str, megabytes: int = 64) -> str:
        """A URL or one header of ``megabytes``, sent until the worker answers."""
        import select

        size = megabytes * 2**20
        if kind == "url":
            start, end = b"GET /", b" HTTP/1.1\r\nHost: w\r\n\r\n"
        else:
            start, end = b"GET /health HTTP/1.1\r\nHost: w\r\nX-Big: ", b"\r\n\r\n"
        piece = b"a" * 65536
        sent = 0
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            try:
                sock.sendall(start)
                while sent < size and not select.select([sock], [], [], 0)[0]:
                    sock.sendall(piece)
                    sent += len(piece)
                if sent >= size:
                    sock.sendall(end)
                sock.shutdown(socket.SHUT_WR)
                reply = sock.recv(65536)
            except OSError as exc:
                return f"{type(exc).__name__} after {sent / 2**20:.1f} MB"
        status = reply.split(b"\r\n", 1)[0].decode(errors="replace")
        return f"{status} after {sent / 2**20:.2f} MB sent"

    def idle_connections(count: int, hold_s: float) -> str:
        """``count`` connections that never send a byte, held for ``hold_s``."""
        socks = []
        try:
            for _ in range(count):
                try:
                    socks.append(socket.create_connection((host, int(port)), timeout=5))
                except OSError as exc:
                    return f"connect failed after {len(socks)}: {exc}"
            time.sleep(hold_s)
            open_ = 0
            for sock in socks:
                sock.setblocking(False)
                try:
                    open_ += sock.recv(1) != b""  # b"": closed by the worker
                except BlockingIOError:
                    open_ += 1  # nothing to read, not closed
                except OSError:
                    pass
            return f"{open_} of {count} still open after {hold_s:g} s"
        finally:
            for sock in socks:
                sock.close()

    bomb180 = silent_flac(180, 192_000, 8)
    bomb60 = silent_flac(60, 192_000, 8)
    wav31 = big_wav(30.7)
    return [
        (f"FLAC bomb 180 s 192 kHz 8 ch ({len(bomb180) // 1024} KB), transcription",
         lambda: transcribe(bomb180)),
        (f"FLAC bomb 60 s 192 kHz 8 ch ({len(bomb60) // 1024} KB), chat input_audio",
         lambda: chat_audio(bomb60)),
        ("prompt 3 MB", lambda: prompt(3)),
        ("prompt 10 MB", lambda: prompt(10)),
        (f"3 voice uploads of {len(wav31) / 2**20:.1f} MB wav", lambda: voices(wav31, 3, "big")),
        ("voices of 29 s until the fleet quota", voice_quota),
        ("20 clients gone mid-body", lambda: gone_mid_body(20)),
        ("20 malformed requests", lambda: malformed(20)),
        ("a 64 MB URL", lambda: huge_head("url")),
        ("a 64 MB header", lambda: huge_head("header")),
        ("2,000 idle connections, 32 s", lambda: idle_connections(2000, 32.0)),
    ]  # fmt: skip


# -- a worker of our own -------------------------------------------------------------------------


def start_worker(redis_url: str, spec: str) -> tuple[subprocess.Popen, str, str]:
    port = free_port()
    worker_id = f"hostile-{port}"
    log = open(tempfile.mkstemp(prefix="hostile-worker-", suffix=".log")[1], "wb")  # noqa: SIM115
    argv = [sys.executable, "-m", "worker.cli", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--redis-url", redis_url, "--worker-id", worker_id, "--spec", spec]
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"worker exited {proc.returncode}; log: {log.name}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                print(f"worker ready at {url} (log {log.name})", file=sys.stderr)
                return proc, url, worker_id
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"worker not ready; log: {log.name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running worker (default: start one)")
    parser.add_argument("--worker-pid", type=int, help="its HTTP process, for RSS")
    parser.add_argument("--worker-id", help="its fleet id (default: from /health)")
    parser.add_argument("--redis-url", help="its Redis (default: start one)")
    parser.add_argument("--redis-pid", type=int, help="redis-server's pid, for RSS")
    parser.add_argument("--fleet", default="default")
    parser.add_argument("--token", default=os.environ.get("OMNI_WORKER_TOKEN"))
    parser.add_argument("--spec", default="configs/models/tiny-omni.yaml")
    args = parser.parse_args()
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}

    own_redis = own_worker = None
    if args.url is None:
        own_redis = RedisServer().start()
        own_worker, url, _ = start_worker(own_redis.url, args.spec)
        worker_pid, redis_url, redis_pid = own_worker.pid, own_redis.url, own_redis.process.pid
    else:
        url, worker_pid = args.url.rstrip("/"), args.worker_pid or 0
        redis_url, redis_pid = args.redis_url, args.redis_pid or 0
        if not redis_url:
            raise SystemExit("--url needs --redis-url (and --worker-pid, --redis-pid for RSS)")
    try:
        worker_id = args.worker_id or httpx.get(url + "/health", timeout=10).json()["worker_id"]
        record = FleetKeys(args.fleet).worker(worker_id)
        rows = []
        for name, scenario in scenarios(url, headers):
            watch = Watch(url, headers, worker_pid, redis_pid, redis_url, record)
            started = time.monotonic()
            result = watch.run(scenario)
            rows.append((name, result, time.monotonic() - started, watch))
            print(f"done: {name}", file=sys.stderr)
        print()
        print(
            "| input | worker's answer | s | worker RSS MB | Redis RSS MB | other client "
            "(served / failed, slowest s) | worker record |"
        )
        print("|---|---|---:|---:|---:|---|---|")
        for name, result, seconds, w in rows:
            alive = "alive" if w.record_missing == 0 else f"MISSING x{w.record_missing}"
            other = f"{w.served} / {w.failed}, {w.slowest_s:.2f}"
            print(
                f"| {name} | {result} | {seconds:.1f} | {w.peak_worker:.0f} | "
                f"{w.peak_redis:.0f} | {other} | {alive} |"
            )
    finally:
        if own_worker is not None:
            own_worker.terminate()
            own_worker.wait(timeout=60)
        if own_redis is not None:
            own_redis.stop()


if __name__ == "__main__":
    main()
