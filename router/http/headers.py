"""Reading a client's request headers once, for HTTP requests and WebSocket upgrades alike:
what routing needs (credential, content type, session key) and the lines forwarded to the
worker, without hop-by-hop headers, internal ``x-omni-*`` ones, or any header that the
client's ``Connection`` names (RFC 9110 7.6.1)."""

from __future__ import annotations

from router.http.wire import DROP_REQUEST, INTERNAL_PREFIX

# Connection options that name no header of their own
_CONNECTION_OPTIONS = frozenset({b"close", b"keep-alive", b"upgrade"})


def read_client_headers(
    headers: list[tuple[bytes, bytes]], session_name: bytes, keep_auth: bool
) -> tuple[list[bytes], bytes | None, bytes | None, bytes | None]:
    """(forwarded lines, Authorization, Content-Type, session key) of a request's headers, the
    lines as a flat list: name, b": ", value, b"\r\n" per forwarded header (a tuple, not an
    object: this runs for every request). ``headers``: (lower-case name, value). The session
    header is matched before internal headers are dropped, so any configured name works;
    ``keep_auth`` forwards Authorization (False when the router checks API keys itself: that
    credential is not the worker's)."""
    auth = ctype = session = None
    connection: list[bytes] | None = None
    fwd: list[bytes] = []
    for name, value in headers:
        if name == session_name:
            session = value
        if name in DROP_REQUEST or name.startswith(INTERNAL_PREFIX):
            if name == b"connection":
                connection = [value] if connection is None else [*connection, value]
            continue
        if name == b"content-type":
            ctype = value
        elif name == b"authorization":
            auth = value
            if not keep_auth:
                continue
        fwd += (name, b": ", value, b"\r\n")
    if connection is not None:
        named = connection_named(connection)
        if named:
            fwd = without_headers(fwd, named)
    return fwd, auth, ctype, session


def connection_named(values: list[bytes]) -> frozenset[bytes]:
    """Header names listed in ``Connection`` values, other than the plain connection options."""
    names = {t.strip().lower() for v in values for t in v.split(b",")}
    return frozenset(names - _CONNECTION_OPTIONS - {b""})


def without_headers(fwd: list[bytes], names: frozenset[bytes]) -> list[bytes]:
    """``fwd`` (groups of name, ": ", value, CRLF) less the headers called ``names``
    (lower case; the names in ``fwd`` may be in any case)."""
    out: list[bytes] = []
    for i in range(0, len(fwd), 4):
        if fwd[i].lower() not in names:
            out += fwd[i : i + 4]
    return out
