"""A real ``redis-sentinel`` on loopback for tests: one sentinel (quorum 1) watching one
master, so that a test can kill the master and see its replica promoted."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from fleet.redis_server import free_port


class Sentinel:
    """``redis-server --sentinel`` watching one master on loopback; quorum 1."""

    def __init__(
        self, master_port: int, service: str, password: str | None, down_after_ms: int = 1000
    ) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="omni-sentinel-"))
        lines = [
            f"port {self.port}",
            "bind 127.0.0.1",
            f"dir {self.dir}",
            f"sentinel monitor {service} 127.0.0.1 {master_port} 1",
            f"sentinel down-after-milliseconds {service} {down_after_ms}",
            f"sentinel failover-timeout {service} 10000",
        ]
        if password:
            lines.append(f'sentinel auth-pass {service} "{password}"')
        # Sentinel rewrites its config file as it learns: it must be a writable file of its own.
        self.config = self.dir / "sentinel.conf"
        self.config.write_text("\n".join(lines) + "\n")
        binary = shutil.which("redis-sentinel") or shutil.which("redis-server")
        assert binary is not None
        self.process = subprocess.Popen(
            [binary, str(self.config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def wait_for_master(self, service: str, timeout_s: float = 10.0) -> None:
        client = redis.Redis(port=self.port, socket_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                assert self.process.poll() is None, "sentinel exited"
                try:
                    if client.sentinel_get_master_addr_by_name(service):
                        return
                except (TimeoutError, redis.ConnectionError):
                    pass
                time.sleep(0.05)
            raise TimeoutError(f"sentinel on {self.port} did not report {service}")
        finally:
            client.close()

    def master_port(self, service: str) -> int:
        client = redis.Redis(port=self.port, socket_timeout=1)
        try:
            return int(client.sentinel_get_master_addr_by_name(service)[1])
        finally:
            client.close()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)
