"""Realtime conversations in Redis, so that a session outlives the worker that served it.

A realtime session (``/v1/realtime``) is named by its session id: the router's affinity header
(``x-session-id`` from the client, forwarded to the worker as ``x-omni-session``) or the
``session_id`` query parameter. Every change to the session's conversation is written here at
once: its items, oldest first, in one Redis list (at most ``max_items``: older ones drop off),
and its settings (voice, instructions, output modalities, turn detection) in one JSON string.
Both expire ``ttl_ms`` after the last change.

Resume: a client that reconnects with the same session id -- after its worker died or drained,
on whichever worker the router then picks -- gets a session whose conversation is the stored
one; the next response sees the whole history. A response in flight is noted here while it runs
(its ids and the ``response.create`` fields): if its worker dies, the session's new worker runs it
again, whole, under the same ids, so the client gets the answer once (docs/realtime.md). A
response that ends on its worker (done, cancelled, or cut by the client's disconnect) clears the
note; it keeps only what was stored of it (an assistant item is stored when it is done or
cancelled, truncated to what was sent). With API keys, the router's key id scopes the name, so
one key cannot read another's conversation by guessing its session id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from fleet.keys import FleetKeys
from fleet.redis_url import RedisClient


@dataclass(slots=True)
class StoredConversation:
    items: list[dict] = field(default_factory=list)
    config: dict | None = None


def conversation_name(session_id: str, owner: str = "") -> str:
    """The stored name of a session: its id, under its API key's id when there is one."""
    return f"{owner}/{session_id}" if owner else session_id


class ConversationStore:
    def __init__(
        self, client: RedisClient, fleet: str = "default", *, max_items: int, ttl_ms: int
    ) -> None:
        self.redis = client
        self.keys = FleetKeys(fleet)
        self.max_items = max_items
        self.ttl_ms = ttl_ms

    async def load(self, name: str) -> StoredConversation:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.lrange(self.keys.conversation(name), 0, -1)
            pipe.get(self.keys.conversation_config(name))
            raw_items, raw_config = await pipe.execute()
        items = [orjson.loads(raw) for raw in raw_items]
        return StoredConversation(items, orjson.loads(raw_config) if raw_config else None)

    async def append(self, name: str, item: dict) -> None:
        key = self.keys.conversation(name)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.rpush(key, orjson.dumps(item))
            pipe.ltrim(key, -self.max_items, -1)
            pipe.pexpire(key, self.ttl_ms)
            pipe.pexpire(self.keys.conversation_config(name), self.ttl_ms)
            await pipe.execute()

    async def replace(self, name: str, items: list[dict]) -> None:
        """Rewrite the whole list (an item truncated or deleted)."""
        key = self.keys.conversation(name)
        kept = items[-self.max_items :]
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            if kept:
                pipe.rpush(key, *(orjson.dumps(item) for item in kept))
                pipe.pexpire(key, self.ttl_ms)
            pipe.pexpire(self.keys.conversation_config(name), self.ttl_ms)
            await pipe.execute()

    async def save_config(self, name: str, config: dict) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.conversation_config(name), orjson.dumps(config), px=self.ttl_ms)
            pipe.pexpire(self.keys.conversation(name), self.ttl_ms)
            await pipe.execute()

    async def set_pending(self, name: str, response: dict) -> None:
        await self.redis.set(
            self.keys.conversation_pending(name), orjson.dumps(response), px=self.ttl_ms
        )

    async def clear_pending(self, name: str) -> None:
        await self.redis.delete(self.keys.conversation_pending(name))

    async def take_pending(self, name: str) -> dict | None:
        """The response that was in flight when the session's last worker stopped, if any
        (taken: a second resume does not run it again unless the re-run notes it anew)."""
        raw = await self.redis.getdel(self.keys.conversation_pending(name))
        return orjson.loads(raw) if raw else None

    async def delete(self, name: str) -> None:
        await self.redis.delete(
            self.keys.conversation(name),
            self.keys.conversation_config(name),
            self.keys.conversation_pending(name),
        )
