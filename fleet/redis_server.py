"""A private ``redis-server`` process: for tests, and for ``omni-router --local-workers``."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _resp(*parts: str) -> bytes:
    """One command in RESP, so that arguments with spaces or CRLF stay intact."""
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        data = part.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class RedisServer:
    """Starts ``redis-server`` on a free loopback port in a private directory; nothing is
    persisted. ``stop()`` and ``start()`` again keep the port, so clients can reconnect."""

    def __init__(
        self,
        port: int | None = None,
        binary: str | None = None,
        *,
        password: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        found = binary or shutil.which("redis-server")
        if found is None:
            raise FileNotFoundError("redis-server is not on PATH (apt-get install redis-server)")
        self.binary = found
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="omni-redis-"))
        self.process: subprocess.Popen[bytes] | None = None
        # ``requirepass``: clients must AUTH; ``url`` then carries the password.
        self.password = password
        # Appended last, so they override the defaults above (e.g. "--appendonly", "yes").
        self.extra_args = list(extra_args)

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "no",
            "--protected-mode", "yes",
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        args += self.extra_args
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.dir
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    if self._ping(sock):
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"redis-server on port {self.port} not ready in {timeout_s}s")

    def _ping(self, sock: socket.socket) -> bool:
        if self.password:
            sock.sendall(_resp("AUTH", self.password))
            if not sock.recv(64).startswith(b"+OK"):
                return False
        sock.sendall(_resp("PING"))
        return sock.recv(16).startswith(b"+PONG")

    def stop(self, kill: bool = False) -> None:
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        self.process.wait(timeout=10)
        self.process = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
