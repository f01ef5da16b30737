"""The HTTP/1.1 protocol the worker serves: uvicorn's own (httptools when installed, else
h11), except that a request it cannot parse gets the worker's OpenAI-style JSON error instead
of uvicorn's plain-text "Invalid HTTP request received.". uvicorn answers those before any
ASGI code runs, so this is the one place to change it."""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

from fleet.errors import ErrorCode, error_bytes

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is optional for uvicorn
    HttpToolsProtocol = None  # type: ignore[assignment,misc]


def malformed_response(reason: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A complete 400 response; the connection closes after it (its framing is unknown)."""
    body = error_bytes(
        400, ErrorCode.INVALID_REQUEST, f"malformed HTTP request: {reason.rstrip('.')}"
    )
    head = [b"HTTP/1.1 400 Bad Request\r\n"]
    head += [name + b": " + value + b"\r\n" for name, value in default_headers]
    head += [
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"x-omni-error-code: " + ErrorCode.INVALID_REQUEST.value.encode() + b"\r\n",
        b"connection: close\r\n\r\n",
    ]
    return b"".join(head) + body


class JsonErrorsH11(H11Protocol):
    def send_400_response(self, msg: str) -> None:
        # Written raw: h11's state machine is in its error state after a parse failure.
        self.transport.write(malformed_response(msg, self.server_state.default_headers))
        self.transport.close()


if HttpToolsProtocol is not None:

    class JsonErrorsHttpTools(HttpToolsProtocol):
        def send_400_response(self, msg: str) -> None:
            self.transport.write(malformed_response(msg, self.server_state.default_headers))
            self.transport.close()


def http_protocol() -> type[asyncio.Protocol]:
    """What uvicorn's ``http="auto"`` would pick, answering malformed requests in JSON."""
    if HttpToolsProtocol is not None:
        return JsonErrorsHttpTools
    return JsonErrorsH11
