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


class RawWorker:
    """A minimal HTTP worker on a thread, for what the fake worker cannot do: record request
    heads verbatim, add response headers, or reset a connection without answering.

    ``/health`` is always answered 200. Other requests: ``reset`` -> the connection is reset
    (RST) right after the request head arrives; otherwise a 200 JSON answer with
    ``extra_headers``. Every non-health request head is kept in ``heads``. ``varying``: each
    answer is ``body``'s length of one byte value of its own (1, 2, ... in order)."""

    def __init__(
        self,
        reset: bool = False,
        extra_headers: bytes = b"",
        body: bytes | None = None,
        varying: bool = False,
    ) -> None:
        import threading

        self.reset = reset
        self.varying = varying
        self.extra_headers = extra_headers
        self.body = body or b'{"choices": [{"message": {"content": "raw"}}]}'
        self.heads: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.closed = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        import threading

        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        import struct

        buf = b""
        with conn:
            conn.settimeout(10)
            while True:
                while b"\r\n\r\n" not in buf:
                    try:
                        piece = conn.recv(65536)
                    except OSError:
                        return
                    if not piece:
                        return
                    buf += piece
                head, _, buf = buf.partition(b"\r\n\r\n")
                if head.startswith(b"GET /health "):
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                    continue
                self.heads.append(head)
                if self.reset:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return  # closing with linger 0 sends RST
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    piece = conn.recv(65536)
                    if not piece:
                        return
                    buf += piece
                buf = buf[length:]
                body = self.body
                if self.varying:
                    body = bytes([len(self.heads) % 255]) * len(body)  # (1 for the first)
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n%b\r\n%b" % (len(body), self.extra_headers, body)
                )

    def close(self) -> None:
        self.closed = True
        self.sock.close()
