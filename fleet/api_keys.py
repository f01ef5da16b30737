"""The id of an API key, as the router tells it to workers: never the key itself."""

from __future__ import annotations

import hashlib

# Set by the router on requests it authenticated (clients cannot send it: the router drops
# every client ``x-omni-*`` header); workers charge per-key quotas (voices) to it.
API_KEY_ID_HEADER = "x-omni-api-key-id"


def api_key_id(key: bytes | str) -> str:
    """A stable, non-reversible 16-hex-digit id of ``key``."""
    raw = key.encode() if isinstance(key, str) else key
    return hashlib.sha256(b"omni-fleet api key\0" + raw).hexdigest()[:16]
