"""Production Redis URLs beyond what ``redis.from_url`` understands: Sentinel and Cluster.

``redis://``, ``rediss://`` (TLS) and ``unix://`` URLs go to redis-py unchanged. A Sentinel
deployment is named by one URL too, so that ``OMNI_REDIS_URL`` stays the single knob:

    redis+sentinel://[[user]:password@]host1[:port1][,host2[:port2]...]/service_name[/db]
        [?sentinel_password=...&sentinel_username=...]
    rediss+sentinel://...   (TLS to the sentinels and to the master)

The password in the user-info part authenticates against the master (and its replicas); the
sentinels themselves often run without AUTH, or with their own ``sentinel_password``. Sentinel
port defaults to 26379, db to 0.

A Redis Cluster is named by some of its nodes (the client discovers the rest):

    redis+cluster://[[user]:password@]host1[:port1][,host2[:port2]...][/]
        [?ssl_ca_certs=...&ssl_certfile=...&ssl_keyfile=...&ssl_cert_reqs=...]
    rediss+cluster://...    (TLS)

Port defaults to 6379; a cluster has only db 0. Every key of a fleet carries the hash tag
``{<fleet>}`` (``fleet.keys``), so the store's transactions and scripts stay on one slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379
_SENTINEL_QUERY = ("sentinel_password", "sentinel_username")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
DEFAULT_REDIS_PORT = 6379
_CLUSTER_QUERY = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")

# What ``fleet.store.connect`` returns: one server (plain, TLS, unix, via Sentinel) or a cluster.
RedisClient = aioredis.Redis | RedisCluster


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """A parsed ``redis+sentinel://`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    service_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None
    ssl: bool = False


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SENTINEL_SCHEMES


def _host_port(
    item: str, url: str, default_port: int = DEFAULT_SENTINEL_PORT, what: str = "sentinel"
) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``."""
    if item.startswith("["):
        host, sep, rest = item[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"bad IPv6 {what} address {item!r} in {url!r}")
        port_text = rest[1:]
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise ValueError(f"empty {what} host in {url!r}")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad {what} port {port_text!r} in {url!r}")
    return host, int(port_text)


def _credentials(creds: str, shown: str) -> tuple[str | None, str | None]:
    """(username, password) from the user-info part of a URL."""
    user, colon, secret = creds.partition(":")
    if not colon:
        # redis-py would read "secret@host" as a user name with no password: say so.
        raise ValueError(
            f"credentials without ':' in {shown!r}: write :password@ or user:password@"
        )
    return unquote(user) or None, unquote(secret) or None


@dataclass(frozen=True, slots=True)
class _MultiHostURL:
    """The parts that Sentinel and Cluster URLs share."""

    shown: str  # the URL with its credentials removed, for error messages
    hosts: tuple[tuple[str, int], ...]
    path: str
    options: dict[str, str]
    username: str | None
    password: str | None
    ssl: bool


def _split_multi_host(
    url: str,
    schemes: tuple[str, ...],
    kind: str,
    what: tuple[str, str],  # a host's name, singular and plural
    port: int,
    known: tuple[str, ...],
) -> _MultiHostURL:
    """``scheme://[creds@]host[:port],.../path?query``; every mistake raises ``ValueError``
    naming the part at fault, and never repeats the password."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in schemes:
        raise ValueError(f"not a {kind} URL (schemes: {', '.join(schemes)})")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    creds, at, hosts = netloc.rpartition("@")
    shown = f"{scheme}://{'***@' if at else ''}{hosts}/{path}"
    username, password = _credentials(creds, shown) if at else (None, None)
    if not hosts:
        raise ValueError(f"no {what[1]} in {shown!r}")
    options: dict[str, str] = {}
    for name, values in parse_qs(query, keep_blank_values=True).items():
        if name not in known:
            raise ValueError(f"unknown option {name!r} in {kind} URL; known: {', '.join(known)}")
        options[name] = values[-1]
    return _MultiHostURL(
        shown=shown,
        hosts=tuple(_host_port(h.strip(), shown, port, what[0]) for h in hosts.split(",")),
        path=path,
        options=options,
        username=username,
        password=password,
        ssl=scheme.lower().startswith("rediss"),
    )


def parse_sentinel_url(url: str) -> SentinelURL:
    """Parse a Sentinel URL; every mistake raises ``ValueError`` naming the part at fault.

    Error messages never repeat the password: the URL is quoted with credentials removed."""
    u = _split_multi_host(
        url,
        SENTINEL_SCHEMES,
        "Sentinel",
        ("sentinel", "sentinel hosts"),
        DEFAULT_SENTINEL_PORT,
        _SENTINEL_QUERY,
    )
    shown = u.shown
    parts = [p for p in u.path.split("/") if p]
    if not parts:
        raise ValueError(f"no service name in {shown!r}: expected .../<service_name>[/<db>]")
    if len(parts) > 2:
        raise ValueError(f"too many path parts in {shown!r}: expected /<service_name>[/<db>]")
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit():
            raise ValueError(f"db must be a number, got {parts[1]!r} in {shown!r}")
        db = int(parts[1])

    return SentinelURL(
        sentinels=u.hosts,
        service_name=unquote(parts[0]),
        db=db,
        username=u.username,
        password=u.password,
        sentinel_username=u.options.get("sentinel_username") or None,
        sentinel_password=u.options.get("sentinel_password") or None,
        ssl=u.ssl,
    )


class _SentinelMasterRedis(aioredis.Redis):
    """The master's client; closing it also closes the connections to the sentinels."""

    # not called ``sentinel``: that name is redis-py's SENTINEL command on every client
    via_sentinel: Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.via_sentinel is not None:
            for client in self.via_sentinel.sentinels:
                await client.aclose()


def _socket_kwargs(connection_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The timeouts that also apply to sentinels and cluster nodes."""
    return {k: v for k, v in connection_kwargs.items() if k.startswith("socket_")}


def _auth_kwargs(username: str | None, password: str | None, ssl: bool) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if password:
        kwargs["password"] = password
    if username:
        kwargs["username"] = username
    if ssl:
        kwargs["ssl"] = True
    return kwargs


def sentinel_client(parsed: SentinelURL, **connection_kwargs: Any) -> aioredis.Redis:
    """A client for the current master of ``parsed.service_name``. It asks the sentinels on
    (re)connect, so a failover moves it to the promoted replica without a restart."""
    sentinel_kwargs = _socket_kwargs(connection_kwargs) | _auth_kwargs(
        parsed.sentinel_username, parsed.sentinel_password, parsed.ssl
    )
    master_kwargs = dict(connection_kwargs, db=parsed.db) | _auth_kwargs(
        parsed.username, parsed.password, parsed.ssl
    )
    sentinel = Sentinel(list(parsed.sentinels), sentinel_kwargs=sentinel_kwargs)
    client = sentinel.master_for(
        parsed.service_name, redis_class=_SentinelMasterRedis, **master_kwargs
    )
    client.via_sentinel = sentinel
    return client


def is_cluster_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


@dataclass(frozen=True, slots=True)
class ClusterURL:
    """A parsed ``redis+cluster://`` URL."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    ssl: bool = False
    options: tuple[tuple[str, str], ...] = ()  # TLS file options, passed to redis-py


def parse_cluster_url(url: str) -> ClusterURL:
    """Parse a Cluster URL; mistakes raise ``ValueError`` without repeating the password."""
    u = _split_multi_host(
        url,
        CLUSTER_SCHEMES,
        "Cluster",
        ("cluster node", "cluster nodes"),
        DEFAULT_REDIS_PORT,
        _CLUSTER_QUERY,
    )
    if u.path.strip("/") not in ("", "0"):
        raise ValueError(f"a Redis Cluster has only db 0, got {u.path!r} in {u.shown!r}")
    return ClusterURL(
        nodes=u.hosts,
        username=u.username,
        password=u.password,
        ssl=u.ssl,
        options=tuple(u.options.items()),
    )


def cluster_client(parsed: ClusterURL, **connection_kwargs: Any) -> RedisCluster:
    """A cluster client that starts from ``parsed.nodes`` and discovers the rest."""
    kwargs = (
        _socket_kwargs(connection_kwargs)
        | dict(parsed.options)
        | _auth_kwargs(parsed.username, parsed.password, parsed.ssl)
    )
    return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in parsed.nodes], **kwargs)
