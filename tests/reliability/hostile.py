"""Helpers for hostile-client tests: raw sockets with bounded sends, and /proc readings of the
router process (peak memory, open descriptors)."""

from __future__ import annotations

import socket
from pathlib import Path

import orjson


def send_until_refused(port: int, head: bytes, piece: bytes, total: int) -> tuple[int, bytes]:
    """Send ``head`` then ``piece`` repeatedly, up to ``total`` bytes, for as long as the router
    reads. Returns (bytes sent, what the router answered)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(head)
            sent = len(head)
            while sent < total:
                sock.sendall(piece)
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass
        return sent, read_until_closed(sock)


def read_until_closed(sock: socket.socket, limit: int = 1 << 20) -> bytes:
    chunks: list[bytes] = []
    size = 0
    try:
        while size < limit and (piece := sock.recv(65536)):
            chunks.append(piece)
            size += len(piece)
    except (TimeoutError, ConnectionResetError):
        pass
    return b"".join(chunks)


def exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes, then read until the router closes (or ``timeout``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_until_closed(sock)


def status_and_code(answer: bytes) -> tuple[int, str | None]:
    """The status of a raw HTTP answer and the ``error.code`` of its JSON body, if any."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    try:
        return status, orjson.loads(body)["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return status, None


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident set (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime, stime in clock ticks (USER_HZ)
