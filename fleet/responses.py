"""Stored responses of the Responses API (``POST /v1/responses`` with ``store``, the default), so
that ``previous_response_id`` continues a conversation on whichever worker the router picks.

A stored response is one record: the response object as it was returned, the input items of
its request (each with an id, as ``GET /v1/responses/{id}/input_items`` lists them) and the
conversation before it (the earlier requests' inputs and the earlier responses' outputs, without
their instructions, which OpenAI does not carry over). Continuing from it reads one record: the
conversation is ``context + input + output``. With API keys the router's key id scopes the name,
so one key cannot read or continue another's responses. A record expires ``ttl_ms`` after it was
written.

A worker without Redis keeps its latest records in memory (``MemoryResponses``): a conversation
then continues only on that worker.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Protocol

import orjson

from fleet.keys import FleetKeys
from fleet.redis_url import RedisClient


@dataclass(slots=True)
class StoredResponse:
    response: dict  # the Response object, as returned
    input: list[dict]  # its request's input items, with ids
    context: list[dict]  # the conversation before it

    def conversation(self) -> list[dict]:
        """Every item of the conversation up to and including this response's output."""
        return self.context + self.input + self.response["output"]


def stored_name(response_id: str, owner: str = "") -> str:
    return f"{owner}/{response_id}" if owner else response_id


class ResponseStore(Protocol):
    async def put(self, stored: StoredResponse, owner: str) -> None: ...

    async def get(self, response_id: str, owner: str) -> StoredResponse | None: ...

    async def delete(self, response_id: str, owner: str) -> bool: ...


class RedisResponses:
    def __init__(self, client: RedisClient, fleet: str, ttl_ms: int) -> None:
        self.redis = client
        self.keys = FleetKeys(fleet)
        self.ttl_ms = ttl_ms

    async def put(self, stored: StoredResponse, owner: str) -> None:
        key = self.keys.stored_response(stored_name(stored.response["id"], owner))
        await self.redis.set(key, orjson.dumps(asdict(stored)), px=self.ttl_ms)

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        raw = await self.redis.get(self.keys.stored_response(stored_name(response_id, owner)))
        return None if raw is None else StoredResponse(**orjson.loads(raw))

    async def delete(self, response_id: str, owner: str) -> bool:
        key = self.keys.stored_response(stored_name(response_id, owner))
        return bool(await self.redis.delete(key))


class MemoryResponses:
    """The latest ``capacity`` records of one worker, each for ``ttl_s``."""

    def __init__(self, ttl_s: float, capacity: int = 1024) -> None:
        self.ttl_s = ttl_s
        self.capacity = capacity
        self._kept: OrderedDict[str, tuple[float, StoredResponse]] = OrderedDict()

    async def put(self, stored: StoredResponse, owner: str) -> None:
        name = stored_name(stored.response["id"], owner)
        self._kept.pop(name, None)
        self._kept[name] = (time.monotonic() + self.ttl_s, stored)
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        kept = self._kept.get(stored_name(response_id, owner))
        return kept[1] if kept is not None and kept[0] > time.monotonic() else None

    async def delete(self, response_id: str, owner: str) -> bool:
        kept = self._kept.pop(stored_name(response_id, owner), None)
        return kept is not None and kept[0] > time.monotonic()
