"""HTTP/1.1 wire helpers: header filtering, status lines, canned responses."""

from __future__ import annotations

from http import HTTPStatus

import orjson

from fleet.errors import ErrorCode, error_bytes

# Hop-by-hop headers (RFC 9110 7.6.1) plus the framing headers that the router rewrites.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# Dropped from client requests before they go to a worker (re-added by the router as needed).
DROP_REQUEST = HOP_BY_HOP | {b"content-length", b"host", b"expect"}
# Dropped from worker responses (framing is rebuilt; the router sets its own ids).
DROP_RESPONSE = HOP_BY_HOP | {
    b"content-length",
    b"x-omni-request-id",
    b"x-omni-worker-id",
    b"x-omni-worker-token",
}
INTERNAL_PREFIX = b"x-omni-"  # clients may not send internal headers to workers

STATUS_LINES: dict[int, bytes] = {
    s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus
}


def status_line(status: int) -> bytes:
    line = STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d Unknown\r\n" % status


def simple_response(
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    keep_alive: bool = True,
    extra: bytes = b"",
) -> bytes:
    """A complete response with a Content-Length body; ``extra`` is ready-made header lines."""
    return b"".join(
        (
            status_line(status),
            b"content-type: ",
            content_type,
            b"\r\ncontent-length: ",
            str(len(body)).encode(),
            b"\r\n" if keep_alive else b"\r\nconnection: close\r\n",
            extra,
            b"\r\n",
            body,
        )
    )


def error_response(
    status: int,
    code: ErrorCode,
    message: str,
    keep_alive: bool = True,
    extra: bytes = b"",
    param: str | None = None,
) -> bytes:
    body = error_bytes(status, code, message, param)
    return simple_response(status, body, keep_alive=keep_alive, extra=extra)


def json_response(doc: object, status: int = 200, keep_alive: bool = True) -> bytes:
    return simple_response(status, orjson.dumps(doc), keep_alive=keep_alive)


def sse_error_event(message: str) -> bytes:
    """The final event of an SSE stream that broke after its headers."""
    body = error_bytes(502, ErrorCode.STREAM_INTERRUPTED, message)
    return b"data: " + body + b"\n\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)
