"""What makes a reply the same on every worker of a build, so that the router can resume a
stream whose worker died on another worker and skip exactly what the client already has
(docs/reliability.md, "Streams survive a worker's death").

The router stamps every request with its request id (``x-omni-request-id``) and the time it
took the request in (``x-omni-created``), and sends the same two on a replay. From them a worker
derives everything of a reply that is not computed from the request itself:

- the response's ids (``chatcmpl-...``, a chat audio's ``audio-...``): a digest of the request
  id, distinct per prefix;
- ``created`` (and what is counted from it, as an audio's ``expires_at``);
- the seed of a sampled request that has none: a digest of the request id, so that sampled
  output is as reproducible as greedy output.

A request that comes without the router's headers (a worker called directly) gets random ids,
the worker's clock and a random seed, as before.
"""

from __future__ import annotations

import hashlib
import time

from starlette.requests import HTTPConnection

from worker.api.common import new_id

REQUEST_ID_HEADER = "x-omni-request-id"
CREATED_HEADER = "x-omni-created"


def _digest(request: HTTPConnection, salt: str) -> bytes | None:
    rid = request.headers.get(REQUEST_ID_HEADER)
    if not rid:
        return None
    return hashlib.blake2b(f"{salt}\0{rid}".encode(), digest_size=12).digest()


def reply_id(request: HTTPConnection, prefix: str) -> str:
    """``prefix-<24 hex>``: the same for every send of one router request, else random."""
    digest = _digest(request, prefix)
    return new_id(prefix) if digest is None else f"{prefix}-{digest.hex()}"


def created(request: HTTPConnection) -> int:
    """The reply's ``created`` (Unix seconds): when the router took the request in."""
    stamp = request.headers.get(CREATED_HEADER, "")
    return int(stamp) if stamp.isdigit() else int(time.time())


def default_seed(request: HTTPConnection, seed: int | None) -> int | None:
    """``seed`` as given, else one derived from the router's request id (None: a random one)."""
    if seed is not None:
        return seed
    digest = _digest(request, "seed")
    return None if digest is None else int.from_bytes(digest[:8], "little") >> 1
