"""Async access to fleet state in Redis: the only code that knows the key layout's semantics."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson
import redis.asyncio as aioredis
from pydantic import ValidationError

from fleet.keys import FleetKeys
from fleet.records import (
    ConsentRecord,
    EventKind,
    FleetEvent,
    LoadReport,
    ScaleSignal,
    VoiceRecord,
    WorkerRecord,
)
from fleet.redis_url import (
    RedisClient,
    cluster_client,
    is_cluster_url,
    is_sentinel_url,
    parse_cluster_url,
    parse_sentinel_url,
    sentinel_client,
)

# A plan outlives its workers' records by a day, refreshed by their heartbeats.
PLAN_TTL_MS = 24 * 3600 * 1000

# Returns the binding in place after the call: the existing one, or ARGV[1] if none existed.
_BIND_IF_ABSENT = """
local cur = redis.call('GET', KEYS[1])
if cur then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return cur
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
"""

# Moves a binding only if it still points where the caller saw it; returns the binding in place.
_REBIND_IF_UNCHANGED = """
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  if cur == ARGV[1] then redis.call('INCR', KEYS[2]) end
  return ARGV[2]
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return cur
"""

# Stores the load report and publishes it in one round trip. A script rather than a pipeline
# because redis-py's cluster pipelines refuse PUBLISH; the channel is not a key.
_PUBLISH_LOAD = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return redis.call('PUBLISH', ARGV[3], ARGV[1])
"""


# Stores a voice if the fleet's and its owner's quotas allow, replacing one of the same name
# unless another API key owns that one; keeps the usage counters exact. Returns {"ok"}, or
# {scope, used, limit} with scope "fleet" | "key" (over quota) | "owner" (someone else's).
# KEYS: voices hash, the voice's audio, fleet usage counter, per-owner usage hash.
# ARGV: name, record JSON, audio, owner ("" = none), fleet quota, key quota (-1 = no limit).
_PUT_VOICE = """
local new_bytes = string.len(ARGV[3])
local old_bytes = 0
local old_owner = ''
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local ok, rec = pcall(cjson.decode, old)
  -- a record written before quotas has no 'owner': its bytes were never counted
  if ok and type(rec) == 'table' and type(rec['owner']) == 'string' then
    old_owner = rec['owner']
    old_bytes = redis.call('STRLEN', KEYS[2])
  end
end
local owner = ARGV[4]
if owner ~= '' and old_owner ~= '' and old_owner ~= owner then
  return {'owner', 0, 0}
end
local grows = new_bytes > old_bytes
local total = tonumber(redis.call('GET', KEYS[3]) or '0')
local fleet_quota = tonumber(ARGV[5])
if grows and fleet_quota >= 0 and total - old_bytes + new_bytes > fleet_quota then
  return {'fleet', total, fleet_quota}
end
local key_quota = tonumber(ARGV[6])
if owner ~= '' and key_quota >= 0 then
  local used = tonumber(redis.call('HGET', KEYS[4], owner) or '0')
  local after = used + new_bytes
  if old_owner == owner then after = after - old_bytes end
  if after > key_quota and (old_owner ~= owner or grows) then
    return {'key', used, key_quota}
  end
end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SET', KEYS[3], math.max(0, total - old_bytes + new_bytes))
if old_owner ~= '' then
  local left = redis.call('HINCRBY', KEYS[4], old_owner, -old_bytes)
  if left <= 0 then redis.call('HDEL', KEYS[4], old_owner) end
end
if owner ~= '' then redis.call('HINCRBY', KEYS[4], owner, new_bytes) end
return {'ok'}
"""

# Deletes a voice, unless another API key owns it, and gives its bytes back to the fleet's and
# its owner's quotas. Returns 1 if it existed, 0 if not, -1 if someone else's.
# KEYS as for _PUT_VOICE; ARGV: name, the caller's owner id ("" = no key: may delete any).
_DELETE_VOICE = """
local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old then
  redis.call('DEL', KEYS[2])
  return 0
end
local ok, rec = pcall(cjson.decode, old)
local counted = ok and type(rec) == 'table' and type(rec['owner']) == 'string'
if counted and ARGV[2] ~= '' and rec['owner'] ~= '' and rec['owner'] ~= ARGV[2] then
  return -1
end
local bytes = redis.call('STRLEN', KEYS[2])
redis.call('DEL', KEYS[2])
redis.call('HDEL', KEYS[1], ARGV[1])
if not counted then
  return 1  -- stored before quotas: never counted
end
local total = tonumber(redis.call('GET', KEYS[3]) or '0')
redis.call('SET', KEYS[3], math.max(0, total - bytes))
if rec['owner'] ~= '' then
  local left = redis.call('HINCRBY', KEYS[4], rec['owner'], -bytes)
  if left <= 0 then redis.call('HDEL', KEYS[4], rec['owner']) end
end
return 1
"""


class VoiceOwnedByAnotherKey(Exception):
    """Only the API key that uploaded a voice (or a caller without a key: an operator) may
    replace or delete it."""


class VoiceQuotaExceeded(Exception):
    """Storing a voice would take the fleet (``scope="fleet"``) or the uploader's API key
    (``scope="key"``) over its quota; nothing was stored."""

    def __init__(self, scope: str, used: int, limit: int) -> None:
        super().__init__(f"{scope} voice quota: {used} of {limit} bytes used")
        self.scope = scope
        self.used = used
        self.limit = limit


def connect(url: str, *, timeout_s: float = 2.0) -> RedisClient:
    """A client with short timeouts, so that a dead Redis never stalls a request path.

    ``redis://``, ``rediss://`` (TLS) and ``unix://`` go to redis-py; ``redis+sentinel://`` and
    ``rediss+sentinel://`` reach the master through Redis Sentinel; ``redis+cluster://`` and
    ``rediss+cluster://`` give a Redis Cluster client (see ``fleet.redis_url``)."""
    kwargs = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "health_check_interval": 10,
        "retry_on_timeout": False,
    }
    if is_sentinel_url(url):
        return sentinel_client(parse_sentinel_url(url), **kwargs)
    if is_cluster_url(url):
        return cluster_client(parse_cluster_url(url), **kwargs)
    return aioredis.from_url(url, **kwargs)


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


@dataclass(slots=True)
class WorkerView:
    """A worker as a router sees it in one snapshot."""

    record: WorkerRecord
    load: LoadReport | None


class FleetStore:
    def __init__(self, client: RedisClient, fleet: str = "default") -> None:
        self.redis = client
        self.keys = FleetKeys(fleet)
        self._bind = client.register_script(_BIND_IF_ABSENT)
        self._rebind = client.register_script(_REBIND_IF_UNCHANGED)
        self._publish_load = client.register_script(_PUBLISH_LOAD)
        self._put_voice = client.register_script(_PUT_VOICE)
        self._delete_voice = client.register_script(_DELETE_VOICE)

    async def close(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        try:
            return bool(await self.redis.ping())
        except (aioredis.RedisError, OSError):
            return False

    # -- worker side -------------------------------------------------------------------------

    async def write_record(self, record: WorkerRecord, ttl_ms: int) -> None:
        """Create or replace the record, keep it alive for ``ttl_ms``, and index it; its plan
        goes under the plan's digest."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.worker(record.id), record.model_dump_json(), px=ttl_ms)
            pipe.sadd(self.keys.workers, record.id)
            if record.plan is not None and record.plan_digest:
                pipe.set(
                    self.keys.plan(record.plan_digest), orjson.dumps(record.plan), px=PLAN_TTL_MS
                )
            await pipe.execute()

    async def heartbeat(self, record: WorkerRecord, ttl_ms: int) -> bool:
        """Extend the record's TTL (and its plan's). Returns False if the record was gone and
        had to be rewritten (it expired, or Redis restarted empty); the caller then announces
        itself again."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.pexpire(self.keys.worker(record.id), ttl_ms)
            if record.plan_digest:
                pipe.pexpire(self.keys.plan(record.plan_digest), PLAN_TTL_MS)
            alive = (await pipe.execute())[0]
        if alive:
            return True
        await self.write_record(record, ttl_ms)
        return False

    async def publish_load(self, report: LoadReport, ttl_ms: int) -> None:
        data = report.model_dump_json()
        await self._publish_load(
            keys=[self.keys.load(report.worker_id)], args=[data, ttl_ms, self.keys.loads]
        )

    async def publish_event(self, kind: EventKind, worker_id: str, detail: str = "") -> None:
        event = FleetEvent(kind=kind, worker_id=worker_id, detail=detail)
        await self.redis.publish(self.keys.events, event.model_dump_json())

    async def deregister(self, worker_id: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.worker(worker_id), self.keys.load(worker_id))
            pipe.srem(self.keys.workers, worker_id)
            await pipe.execute()
        await self.publish_event(EventKind.LEFT, worker_id)

    # -- router side -------------------------------------------------------------------------

    async def snapshot(self) -> dict[str, WorkerView]:
        """Every live worker with its latest load. Ids whose record expired are pruned."""
        ids = sorted(_text(m) for m in await self.redis.smembers(self.keys.workers))
        if not ids:
            return {}
        # One MGET for records and loads: one round trip, and legal on a cluster (same slot).
        raw = await self.redis.mget(
            [self.keys.worker(i) for i in ids] + [self.keys.load(i) for i in ids]
        )
        records, loads = raw[: len(ids)], raw[len(ids) :]
        views: dict[str, WorkerView] = {}
        expired: list[str] = []
        for worker_id, raw_record, raw_load in zip(ids, records, loads, strict=True):
            if raw_record is None:
                expired.append(worker_id)
                continue
            try:
                record = WorkerRecord.model_validate_json(raw_record)
                load = LoadReport.model_validate_json(raw_load) if raw_load else None
            except ValidationError:
                continue  # one unreadable record (a stray writer) must not hide the others
            views[worker_id] = WorkerView(record, load)
        if expired:
            await self.redis.srem(self.keys.workers, *expired)
        return views

    async def listen(self) -> AsyncIterator[FleetEvent | LoadReport]:
        """Events and load reports as they are published. Ends when the connection breaks."""
        # A cluster client learns the slot map on its first command; its pub/sub needs the map
        # to pick a node, so learn it now (a no-op for a single-server client).
        await self.redis.initialize()
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(self.keys.events, self.keys.loads)
        try:
            async for message in pubsub.listen():
                channel = message["channel"].decode()
                data = message["data"]
                if channel == self.keys.events:
                    yield FleetEvent.model_validate_json(data)
                else:
                    yield LoadReport.model_validate_json(data)
        finally:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    async def publish_scale(self, signals: list[ScaleSignal], ttl_ms: int) -> None:
        """Every model's signal in one hash (one key: legal on a cluster); models no router
        computes any more drop out when the hash expires."""
        if not signals:
            return
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.scale, mapping={s.model: s.model_dump_json() for s in signals})
            pipe.pexpire(self.keys.scale, ttl_ms)
            await pipe.execute()

    async def scale_signals(self) -> dict[str, ScaleSignal]:
        """Model -> its latest signal, for an operator's tools and the tests."""
        raw = await self.redis.hgetall(self.keys.scale)
        return {_text(k): ScaleSignal.model_validate_json(v) for k, v in raw.items()}

    async def plans(self, digests: list[str]) -> dict[str, dict]:
        """Launch plans by digest (those still stored)."""
        if not digests:
            return {}
        raw = await self.redis.mget([self.keys.plan(d) for d in digests])
        return {d: orjson.loads(r) for d, r in zip(digests, raw, strict=True) if r is not None}

    async def lookup_session(self, session_key: str, ttl_ms: int) -> str | None:
        """The worker bound to a session, sliding its TTL."""
        worker = await self.redis.getex(self.keys.affinity(session_key), px=ttl_ms)
        return _text(worker) if worker is not None else None

    async def bind_session(self, session_key: str, worker_id: str, ttl_ms: int) -> str:
        """Bind the session to ``worker_id`` unless another router bound it first.
        Returns the worker that the session is bound to now."""
        bound = await self._bind(keys=[self.keys.affinity(session_key)], args=[worker_id, ttl_ms])
        return bound.decode() if isinstance(bound, bytes) else bound

    async def move_session(self, session_key: str, old: str, new: str, ttl_ms: int) -> str:
        """Move a binding from ``old`` to ``new`` if nobody moved it meanwhile; counts the move.
        Returns the worker that the session is bound to now."""
        bound = await self._rebind(
            keys=[self.keys.affinity(session_key), self.keys.affinity_moves],
            args=[old, new, ttl_ms],
        )
        return bound.decode() if isinstance(bound, bytes) else bound

    async def affinity_moves(self) -> int:
        return int(await self.redis.get(self.keys.affinity_moves) or 0)

    async def session_bindings(self, limit: int = 10_000) -> tuple[dict[str, int], int]:
        """Live session bindings per worker, for dashboards: (worker id -> sessions, bindings
        counted). SCAN walks the whole keyspace, so call it seldom; it stops at ``limit``."""
        pattern = _glob_escape(self.keys.affinity("")) + "*"
        keys: list[bytes] = []
        async for key in self.redis.scan_iter(match=pattern, count=1000):
            keys.append(key)
            if len(keys) >= limit:
                break
        per_worker: dict[str, int] = {}
        for i in range(0, len(keys), 500):
            for worker in await self.redis.mget(keys[i : i + 500]):
                if worker is not None:  # expired between SCAN and MGET
                    wid = _text(worker)
                    per_worker[wid] = per_worker.get(wid, 0) + 1
        return per_worker, len(keys)

    # -- voices ------------------------------------------------------------------------------

    def _voice_keys(self, name: str) -> list[str]:
        k = self.keys
        return [k.voices, k.voice_audio(name), k.voice_bytes, k.voice_bytes_by_owner]

    async def put_voice(
        self,
        record: VoiceRecord,
        audio: bytes,
        *,
        fleet_quota: int | None = None,
        key_quota: int | None = None,
    ) -> None:
        """Store (or replace) a voice, atomically within the quotas: stored voice bytes in the
        fleet, and per ``record.owner``. Raises ``VoiceQuotaExceeded`` (``None``: no limit),
        or ``VoiceOwnedByAnotherKey`` for a name another API key uploaded."""
        result = await self._put_voice(
            keys=self._voice_keys(record.name),
            args=[
                record.name,
                record.model_dump_json(),
                audio,
                record.owner,
                -1 if fleet_quota is None else fleet_quota,
                -1 if key_quota is None else key_quota,
            ],
        )
        if result[0] == b"owner":
            raise VoiceOwnedByAnotherKey(record.name)
        if result[0] != b"ok":
            raise VoiceQuotaExceeded(result[0].decode(), int(result[1]), int(result[2]))

    async def voice_usage(self, owner: str = "") -> tuple[int, int]:
        """(bytes of voices stored in the fleet, of those stored by ``owner``)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.voice_bytes)
            pipe.hget(self.keys.voice_bytes_by_owner, owner or "-")
            total, mine = await pipe.execute()
        return int(total or 0), int(mine or 0)

    async def get_voice(self, name: str) -> tuple[VoiceRecord, bytes] | None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(self.keys.voices, name)
            pipe.get(self.keys.voice_audio(name))
            raw, audio = await pipe.execute()
        if raw is None or audio is None:
            return None
        return VoiceRecord.model_validate_json(raw), audio

    async def list_voices(self) -> list[VoiceRecord]:
        raw = await self.redis.hvals(self.keys.voices)
        return sorted((VoiceRecord.model_validate_json(r) for r in raw), key=lambda v: v.name)

    # -- voice consents ----------------------------------------------------------------------

    async def put_consent(self, record: ConsentRecord, audio: bytes | None = None) -> None:
        """Store a consent (with its recording), or its new record alone."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self.keys.consents, record.id, record.model_dump_json())
            if audio is not None:
                pipe.set(self.keys.consent_audio(record.id), audio)
            await pipe.execute()

    async def get_consent(self, consent_id: str) -> ConsentRecord | None:
        raw = await self.redis.hget(self.keys.consents, consent_id)
        return None if raw is None else ConsentRecord.model_validate_json(raw)

    async def list_consents(self) -> list[ConsentRecord]:
        raw = await self.redis.hvals(self.keys.consents)
        records = (ConsentRecord.model_validate_json(r) for r in raw)
        return sorted(records, key=lambda c: (c.created_at, c.id))

    async def delete_consent(self, consent_id: str) -> bool:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.consents, consent_id)
            pipe.delete(self.keys.consent_audio(consent_id))
            removed, _ = await pipe.execute()
        return bool(removed)

    async def put_reply_transcript(self, audio_id: str, transcript: str, ttl_ms: int) -> None:
        await self.redis.set(self.keys.reply_transcript(audio_id), transcript, px=ttl_ms)

    async def reply_transcript(self, audio_id: str) -> str | None:
        raw = await self.redis.get(self.keys.reply_transcript(audio_id))
        return None if raw is None else _text(raw)

    async def delete_voice(self, name: str, owner: str = "") -> bool:
        """False if there is no such voice; raises ``VoiceOwnedByAnotherKey`` if ``owner`` (the
        caller's API key id) is set and another key uploaded it."""
        result = await self._delete_voice(keys=self._voice_keys(name), args=[name, owner])
        if result == -1:
            raise VoiceOwnedByAnotherKey(name)
        return bool(result)


def _text(value: bytes | str) -> str:
    """A reply as text (the client returns bytes; redis-py's types also allow str)."""
    return value.decode() if isinstance(value, bytes) else value
