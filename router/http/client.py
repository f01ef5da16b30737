"""A tiny one-shot HTTP/1.1 GET for probes and fleet queries (off the request path)."""

from __future__ import annotations

import asyncio

import httptools


class _Response:
    def __init__(self) -> None:
        self.body: list[bytes] = []
        self.done = False

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done = True


async def http_get(
    host: str, port: int, path: str, timeout_s: float, headers: bytes = b""
) -> tuple[int, bytes]:
    """(status, body). Raises OSError or TimeoutError when the worker cannot answer."""
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(
                b"GET %b HTTP/1.1\r\nhost: %b:%d\r\nconnection: close\r\n%b\r\n"
                % (path.encode(), host.encode(), port, headers)
            )
            resp = _Response()
            parser = httptools.HttpResponseParser(resp)
            while not resp.done:
                data = await reader.read(65536)
                if not data:
                    break
                try:
                    parser.feed_data(data)
                except httptools.HttpParserError as exc:
                    raise OSError(f"bad HTTP response: {exc}") from None
            if not resp.done and parser.get_status_code() == 0:
                raise OSError("connection closed before a response")
            return parser.get_status_code(), b"".join(resp.body)
        finally:
            writer.close()
