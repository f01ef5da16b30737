"""``omni-bench``: parse settings, find (or start) the fleet, run the levels, write the report."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError
from pydantic_settings import CliApp
from rich.console import Console

from bench.omnibench import report as reports
from bench.omnibench.loadgen import Plan, run
from bench.omnibench.prompts import builtin_prompts, read_prompts
from bench.omnibench.settings import BenchSettings
from bench.omnibench.workloads import Target
from fleet.cli_help import cli_source
from fleet.redis_server import free_port
from router.local_fleet import READY_LINE


class BenchError(RuntimeError):
    """The run cannot start; the message says why."""


@contextlib.contextmanager
def local_fleet(settings: BenchSettings, console: Console) -> Iterator[str]:
    """``omni-router --local-workers N`` as a child process: its URL once it says it is ready;
    stopped (workers drained, Redis gone) on the way out."""
    port = free_port()
    argv = [
        sys.executable, "-m", "router.cli", "--local-workers", str(settings.local_workers),
        "--local-spec", settings.local_spec, "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip
    console.print(f"starting {settings.local_workers} local worker(s) of {settings.local_spec}")
    child = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    ready = threading.Event()
    tail: list[str] = []

    def read() -> None:  # the child's output: the ready line, and the tail for a failure
        assert child.stdout is not None
        for line in child.stdout:
            tail[:] = [*tail[-30:], line.rstrip()]
            if line.startswith(READY_LINE):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while not ready.wait(0.5):
            if child.poll() is not None:
                raise BenchError("the local fleet did not start:\n" + "\n".join(tail))
        yield f"http://127.0.0.1:{port}"
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def discover(settings: BenchSettings, url: str) -> tuple[Target, dict[str, Any]]:
    """The model to ask for and what it serves, from ``/v1/models``; a workload it does not
    serve is refused here, before any load."""
    headers = {"Authorization": f"Bearer {settings.api_key.get_secret_value()}"} if (
        settings.api_key
    ) else {}  # fmt: skip
    try:
        answer = httpx.get(url + "/v1/models", headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        raise BenchError(f"{url}: {exc}") from None
    if answer.status_code != 200:
        raise BenchError(f"{url}/v1/models answered {answer.status_code}: {answer.text[:200]}")
    models = {m["id"]: m for m in answer.json()["data"]}
    if not models:
        raise BenchError(f"{url} serves no model yet")
    name = settings.model or next(iter(models))
    if name not in models:
        raise BenchError(f"model {name!r} is not served at {url}: {', '.join(models)}")
    info = models[name]
    endpoints = frozenset((info.get("capabilities") or {}).get("endpoints") or ["chat"])
    missing = [k.value for k in settings.mix if k.value not in endpoints]
    if missing:
        raise BenchError(
            f"model {name!r} does not serve {', '.join(missing)} (it serves "
            f"{', '.join(sorted(endpoints))}): change --workload"
        )
    voices = info.get("voices") or []
    target = Target(
        base_url=url,
        model=name,
        voice=settings.voice or (voices[0] if voices else None),
        headers=headers,
        max_tokens=settings.max_tokens,
        speech_max_chars=settings.speech_max_chars,
    )
    return target, {"url": url, "model": name, "endpoints": sorted(endpoints)}


def bench(settings: BenchSettings, console: Console) -> reports.Report:
    prompts = read_prompts(settings.prompts) if settings.prompts else builtin_prompts()
    with contextlib.ExitStack() as stack:
        url = settings.url or stack.enter_context(local_fleet(settings, console))
        target, info = discover(settings, url)
        plan = Plan(
            target=target, mix=settings.mix, prompts=prompts, loop=settings.loop,
            levels=settings.levels, duration_s=settings.duration_s, requests=settings.requests,
            warmup=settings.warmup, idle=settings.idle, seed=settings.seed,
            timeout_s=settings.timeout_s,
        )  # fmt: skip
        measured = asyncio.run(run(plan, progress=settings.progress))
    return reports.Report(plan, measured.idle, measured.levels, info)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        settings = CliApp.run(
            BenchSettings,
            cli_args=argv,
            cli_settings_source=cli_source(BenchSettings, "omni-bench", argv),
        )
    except ValidationError as exc:
        print(f"omni-bench: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    console = Console(stderr=False, width=None if os.isatty(1) else 160)
    try:
        report = bench(settings, console)
    except (BenchError, ValueError, OSError) as exc:
        print(f"omni-bench: {exc}", file=sys.stderr)
        return 1
    report.print(console)
    json_path, html_path = reports.write(report, Path(settings.out))
    console.print(f"every request: {json_path}\nreport: {html_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
