"""Socket-level checks on worker connections: a duplicate socket to peek with, and whether the
worker has closed its end (without reading from the stream the relay parses)."""

from __future__ import annotations

import asyncio
import os
import socket

_PEEK_FLAGS = socket.MSG_PEEK | socket.MSG_DONTWAIT


def peek_socket(transport: asyncio.Transport) -> socket.socket | None:
    """A duplicate of the transport's socket, used only to peek for EOF on idle connections."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    try:
        return socket.socket(fileno=os.dup(sock.fileno()))
    except OSError:
        return None


_TCP_INFO = getattr(socket, "TCP_INFO", None)  # Linux
_ESTABLISHED = b"\x01"  # first byte of struct tcp_info: tcpi_state


def peer_closed(sock: socket.socket) -> bool:
    """True if the peer closed (or reset) the connection. A killed worker's sockets are closed
    by its kernel at once, so this sees it before we write a request that would never reach it.
    The TCP state (one getsockopt, no exception) is cheaper than a MSG_PEEK read."""
    if _TCP_INFO is not None:
        try:
            return sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 1) != _ESTABLISHED
        except OSError:
            return True
    try:
        sock.recv(1, _PEEK_FLAGS)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True
