"""The fleet under test: a private password-protected ``redis-server``, ``omni-worker`` processes
on tiny-omni and ``omni-router`` processes, all real, on loopback.

Secrets (client API key, router-to-worker token, Redis password) are fresh per fleet and reach
the daemons through ``OMNI_*`` environment variables only, so that the security checks can look
for them in every log, metric and diagnostics document. Scenarios that break something leave
the fleet to :meth:`Fleet.ensure`, which repairs it (restarts Redis or routers, replaces dead
workers) before the next scenario.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import redis
import redis.sentinel

from fleet.keys import FleetKeys
from fleet.redis_server import RedisServer
from tests.fakes.procs import Router
from tests.redis_sentinel import Sentinel
from tests.worker_procs import WorkerProcess

FLEET = "rel"
MODEL = "tiny-omni"
KEYS = FleetKeys(FLEET)

# Short liveness windows so that faults show within seconds; the rest are the defaults.
WORKER_ARGS = (
    "--fleet", FLEET,
    "--heartbeat-interval", "0.5",
    "--heartbeat-ttl", "2",
    "--load-interval", "0.25",
    "--max-audio-seconds", "20",
    "--drain-timeout", "60",
    "--body-timeout", "3",
)  # fmt: skip
# --affinity-bound 1000 switches bounded-load migration off: every session move the suite
# sees is then one that the scenario's fault caused (migration has its own router tests).
# A hung worker's streams and waiting requests are taken over once its record expires (2 s);
# the idle and header timeouts are only the backstop for a worker that beats but does not
# answer, so they are set above what healthy workers take on two busy cores: under the
# sentinel test's 32 streaming clients, a streamed speech's first audio came after up to 9.7 s
# and its longest pause was 7.0 s (measured; with a 6 s idle timeout such healthy streams were
# cut), and a whole WAV from a worker that takes a hung one's share can take longer than that.
ROUTER_ARGS = (
    "--fleet", FLEET,
    "--probe-interval-s", "0.5",
    "--probe-timeout-s", "1",
    "--unhealthy-after", "2",
    "--breaker-failures", "3",
    "--breaker-open-s", "2",
    "--headers-timeout-s", "20",
    "--idle-timeout-s", "20",
    "--resync-interval-s", "0.5",
    "--affinity-bound", "1000",
    "--client-timeout-s", "3",
    # a worker "should" hold 2 requests: a dozen streams make the scaling signal ask for 6
    "--scale-in-flight", "2",
)  # fmt: skip


def wait_until(check: Callable[[], object], timeout: float, what: str, interval: float = 0.1):
    """Poll ``check`` until it returns something truthy; AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = check()
            if last:
                return last
        except (httpx.HTTPError, OSError, redis.RedisError) as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not reached in {timeout}s (last: {last!r})")
        time.sleep(interval)


SENTINEL_SERVICE = "omni-rel"


class Fleet:
    """``sentinel``: Redis is a primary, a replica and a ``redis-sentinel``, and the daemons
    reach it through a ``redis+sentinel://`` URL (``self.redis`` is the first primary)."""

    def __init__(self, n_workers: int = 3, n_routers: int = 2, sentinel: bool = False) -> None:
        self.n_workers = n_workers
        self.n_routers = n_routers
        self.api_key = "sk-rel-" + secrets.token_hex(12)
        self.worker_token = "wt-rel-" + secrets.token_hex(12)
        self.redis_password = "rp-rel-" + secrets.token_hex(12)
        # without the 5 s wait for more replicas, the replica syncs at once
        no_delay = ["--repl-diskless-sync-delay", "0"] if sentinel else []
        self.redis = RedisServer(password=self.redis_password, extra_args=no_delay)
        self.use_sentinel = sentinel
        self.replica: RedisServer | None = None
        self.sentinel: Sentinel | None = None
        self.workers: dict[str, WorkerProcess] = {}
        self.retired: list[WorkerProcess] = []  # stopped or killed; their logs are still read
        self.routers: list[Router] = []
        self._next_worker = 1

    # -- secrets and clients ---------------------------------------------------------------

    @property
    def secrets(self) -> dict[str, str]:
        return {
            "api key": self.api_key,
            "worker token": self.worker_token,
            "redis password": self.redis_password,
        }

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def worker_auth(self) -> dict[str, str]:
        return {"x-omni-worker-token": self.worker_token}

    @property
    def router_urls(self) -> list[str]:
        return [r.url for r in self.routers]

    @property
    def redis_url(self) -> str:
        """What the daemons are given."""
        if self.sentinel is None:
            return self.redis.url
        return (
            f"redis+sentinel://:{self.redis_password}@127.0.0.1:{self.sentinel.port}"
            f"/{SENTINEL_SERVICE}"
        )

    def redis_client(self) -> redis.Redis:
        """A client of the primary (with Sentinel: whichever server it is now)."""
        if self.sentinel is None:
            return redis.Redis.from_url(self.redis.url, socket_timeout=2)
        watcher = redis.sentinel.Sentinel([("127.0.0.1", self.sentinel.port)], socket_timeout=2)
        return watcher.master_for(SENTINEL_SERVICE, password=self.redis_password, socket_timeout=2)

    # -- processes ---------------------------------------------------------------------------

    def start(self) -> Fleet:
        self.redis.start()
        try:
            if self.use_sentinel:
                self._start_sentinel()
            first = self.add_worker()
            # the others start once the first has built the seeded checkpoint in the cache
            wait_until(
                lambda: first.proc.poll() is not None or "launching" in first.log(400),
                240,
                "the first worker's checkpoint",
                interval=0.5,
            )
            for _ in range(self.n_workers - 1):
                self.add_worker()
            for _ in range(self.n_routers):
                self.add_router()
            self.wait_ready(list(self.workers.values()))
            self.wait_converged()
        except BaseException:
            self.close()
            raise
        return self

    def _start_sentinel(self) -> None:
        follow = ["--replicaof", "127.0.0.1", str(self.redis.port),
                  "--masterauth", self.redis_password]  # fmt: skip
        self.replica = RedisServer(password=self.redis_password, extra_args=follow).start()
        self.sentinel = Sentinel(self.redis.port, SENTINEL_SERVICE, self.redis_password)
        self.sentinel.wait_for_master(SENTINEL_SERVICE)

    def add_worker(self) -> WorkerProcess:
        """Start one more worker (not waited for: see wait_ready)."""
        worker_id = f"w{self._next_worker}"
        self._next_worker += 1
        w = WorkerProcess(
            *WORKER_ARGS,
            worker_id=worker_id,
            env={"OMNI_REDIS_URL": self.redis_url, "OMNI_WORKER_TOKEN": self.worker_token},
        )
        w.token = self.worker_token  # WorkerProcess.headers then carries it
        self.workers[worker_id] = w
        return w

    def wait_ready(self, workers: list[WorkerProcess], timeout: float = 300) -> None:
        for w in workers:
            w.wait_ready(timeout)

    def router_env(self) -> dict[str, str]:
        return {
            "OMNI_REDIS_URL": self.redis_url,
            "OMNI_API_KEY": f'["{self.api_key}"]',
            "OMNI_WORKER_TOKEN": self.worker_token,
        }

    def add_router(self, port: int | None = None) -> Router:
        r = Router(*ROUTER_ARGS, port=port, name=f"rel-router-{len(self.routers)}",
                   env=self.router_env())  # fmt: skip
        self.routers.append(r)
        return r

    def restart_router(self, index: int) -> Router:
        old = self.routers[index]
        old.stop()
        new = Router(*ROUTER_ARGS, port=old.port, name=old.name, env=self.router_env())
        self.routers[index] = new
        return new

    def retire(self, worker_id: str) -> WorkerProcess:
        w = self.workers.pop(worker_id)
        self.retired.append(w)
        return w

    @staticmethod
    def draining(w: WorkerProcess) -> bool:
        try:
            reply = httpx.get(w.url + "/ready", timeout=5)
        except httpx.HTTPError:
            return False
        return reply.status_code == 503 and reply.json()["error"]["code"] == "draining"

    def tree(self, w: WorkerProcess) -> list[int]:
        return [w.pid, *w.children()]

    def signal_tree(self, w: WorkerProcess, sig: int) -> None:
        for pid in self.tree(w):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    # -- what the routers see --------------------------------------------------------------

    def diagnostics(self, router: Router) -> dict:
        return httpx.get(router.url + "/diagnostics", headers=self.auth, timeout=5).json()

    def routable(self, router: Router) -> set[str]:
        return {w["id"] for w in self.diagnostics(router)["workers"] if w["routable"]}

    def wait_converged(self, ids: set[str] | None = None, timeout: float = 30) -> None:
        """Every router routes to exactly ``ids`` (default: every live worker)."""
        want = set(self.workers) if ids is None else ids
        for r in self.routers:
            wait_until(
                lambda r=r: self.routable(r) == want, timeout, f"{r.name} routes to {sorted(want)}"
            )

    def router_in_flight(self) -> list[int]:
        return [self.diagnostics(r)["router"]["in_flight"] for r in self.routers]

    def worker_in_flight(self) -> dict[str, int]:
        return {
            wid: httpx.get(w.url + "/load", headers=w.headers, timeout=5).json()["in_flight"]
            for wid, w in self.workers.items()
        }

    def wait_idle(self, timeout: float = 30) -> None:
        """Every router's and worker's in-flight gauge back at zero."""
        wait_until(lambda: not any(self.router_in_flight()), timeout, "router in-flight at 0")
        wait_until(lambda: not any(self.worker_in_flight().values()), timeout, "worker in-flight 0")

    # -- repair ------------------------------------------------------------------------------

    def ensure(self, min_workers: int | None = None, timeout: float = 300) -> Fleet:
        """Bring the fleet back to health after a scenario: Redis up, every router alive, every
        worker process running (not stopped), at least ``min_workers`` of them, all routable."""
        want = self.n_workers if min_workers is None else min_workers
        if self.redis.process is None or self.redis.process.poll() is not None:
            self.redis.process = None
            self.redis.start()
        for i, r in enumerate(self.routers):
            if not r.alive():
                self.restart_router(i)
        for wid, w in list(self.workers.items()):
            self.signal_tree(w, signal.SIGCONT)
            if w.proc.poll() is None and self.draining(w):
                w.wait_exit(90)  # a scenario that failed part-way left it draining: let it go
            if w.proc.poll() is not None:
                self.retire(wid)
        started = [self.add_worker() for _ in range(want - len(self.workers))]
        self.wait_ready(list(self.workers.values()), timeout)
        del started
        self.wait_converged(timeout=60)
        return self

    # -- logs ------------------------------------------------------------------------------

    def logs(self) -> dict[str, str]:
        """Every process's whole log (stdout and stderr), by name."""
        out = {}
        for w in [*self.workers.values(), *self.retired]:
            out[f"worker {w.worker_id}"] = Path(w.log_path).read_text(errors="replace")
        for r in self.routers:
            out[r.name] = r.output()
        return out

    def close(self) -> None:
        for r in self.routers:
            with contextlib.suppress(Exception):
                r.stop(timeout=10)
        for w in [*self.workers.values(), *self.retired]:
            with contextlib.suppress(Exception):
                self.signal_tree(w, signal.SIGCONT)
                w.kill()
        if self.sentinel is not None:
            with contextlib.suppress(Exception):
                self.sentinel.stop()
        for server in (self.replica, self.redis):
            if server is not None:
                with contextlib.suppress(Exception):
                    server.__exit__()
