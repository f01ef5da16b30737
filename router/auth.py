"""Client API keys (``--api-key``): ``Authorization: Bearer <key>`` (OpenAI's clients) or
``Authorization: Api-Key <key>`` (Baseten's scheme, which LiveKit's Baseten plugins send),
compared in constant time. The router's credential, not the worker's: a checked key is not
forwarded."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from pydantic import SecretStr

from fleet.errors import ErrorCode
from router.http.wire import error_response
from router.metrics import Metrics

if TYPE_CHECKING:
    from router.http.server import ClientConnection

_MESSAGE = "missing or invalid API key (Authorization: Bearer ... or Api-Key ...)"


def credential(auth: bytes | None) -> bytes | None:
    """The key an Authorization value carries (None: neither scheme)."""
    if auth is None:
        return None
    scheme = auth[:8].lower()
    if scheme.startswith(b"bearer "):
        return auth[7:].strip()
    return auth[8:].strip() if scheme == b"api-key " else None


class ClientAuth:
    def __init__(self, keys: list[SecretStr], metrics: Metrics) -> None:
        self.keys = [k.get_secret_value().encode() for k in keys] or None
        self.metrics = metrics

    @property
    def required(self) -> bool:
        return self.keys is not None

    def accepts(self, auth: bytes | None) -> bool:
        """Is ``auth`` (an Authorization value) one of the keys? Every key is compared."""
        given = credential(auth)
        if given is None:
            return False
        ok = False
        for key in self.keys or ():
            ok |= hmac.compare_digest(given, key)
        return ok

    def accepts_request(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """For routes that read no other header: keys not required, or a good one given."""
        if self.keys is None:
            return True
        return self.accepts(next((v for n, v in headers if n == b"authorization"), None))

    def refuse(self, client: ClientConnection) -> None:
        """Answer 401 before any worker is touched."""
        self.metrics.error(client.route, ErrorCode.INVALID_API_KEY)
        client.respond(
            error_response(
                401,
                ErrorCode.INVALID_API_KEY,
                _MESSAGE,
                client.keep_alive,
                b"www-authenticate: Bearer\r\n",
            ),
            401,
        )
