"""Production Redis URLs: password auth, TLS/Sentinel URL parsing, and a real Sentinel."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import MasterNotFoundError
from redis.cluster import key_slot

from fleet.keys import FleetKeys
from fleet.records import EventKind, FleetEvent, LoadReport, VoiceRecord, WorkerRecord
from fleet.redis_server import RedisServer, free_port
from fleet.redis_url import (
    DEFAULT_SENTINEL_PORT,
    is_cluster_url,
    is_sentinel_url,
    parse_cluster_url,
    parse_sentinel_url,
)
from fleet.store import FleetStore, connect
from tests.redis_sentinel import Sentinel

REPO = Path(__file__).resolve().parents[1]
# A password with every character that must be percent-encoded in a URL.
PASSWORD = "s3 cr/:@t?#%"


def record(worker_id: str) -> WorkerRecord:
    return WorkerRecord(
        id=worker_id, url="http://127.0.0.1:9", node="n1", model="tiny", served_models=["tiny"]
    )


async def every_store_call(store: FleetStore) -> None:
    """Every FleetStore method once, with its result checked: worker side, router side, voices,
    and pub/sub (events and load reports)."""
    events = store.listen()
    first = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.1)  # let the subscription land before publishing
    await store.write_record(record("w1"), ttl_ms=5000)
    assert await store.heartbeat(record("w1"), ttl_ms=5000) is True
    await store.publish_load(LoadReport(worker_id="w1", in_flight=2), ttl_ms=5000)
    load = await asyncio.wait_for(first, timeout=5)
    assert isinstance(load, LoadReport) and load.in_flight == 2
    view = (await store.snapshot())["w1"]
    assert view.load is not None and view.load.in_flight == 2
    assert await store.bind_session("s", "w1", ttl_ms=5000) == "w1"
    assert await store.lookup_session("s", ttl_ms=5000) == "w1"
    assert await store.move_session("s", "w1", "w2", ttl_ms=5000) == "w2"
    assert await store.affinity_moves() == 1
    await store.put_voice(VoiceRecord(name="v", bytes=3), b"abc")
    got = await store.get_voice("v")
    assert got is not None and got[1] == b"abc"
    assert [v.name for v in await store.list_voices()] == ["v"]
    assert await store.delete_voice("v")
    await store.publish_event(EventKind.READY, "w1")
    event = await asyncio.wait_for(anext(events), timeout=5)
    assert isinstance(event, FleetEvent) and event.kind == EventKind.READY
    await events.aclose()
    await store.deregister("w1")
    assert await store.snapshot() == {}
    assert await store.ping()


# -- URL parsing ---------------------------------------------------------------------------------


def test_sentinel_url_with_hosts_password_db_and_options() -> None:
    url = (
        "redis+sentinel://:pw%40x@10.0.0.1:26380,sentinel-b,[fd00::3]:26381/omni/2"
        "?sentinel_password=sp&sentinel_username=su"
    )
    parsed = parse_sentinel_url(url)
    assert parsed.sentinels == (
        ("10.0.0.1", 26380),
        ("sentinel-b", DEFAULT_SENTINEL_PORT),
        ("fd00::3", 26381),
    )
    assert (parsed.service_name, parsed.db) == ("omni", 2)
    assert (parsed.username, parsed.password) == (None, "pw@x")
    assert (parsed.sentinel_username, parsed.sentinel_password) == ("su", "sp")
    assert parsed.ssl is False


def test_tls_sentinel_url_and_user_credentials() -> None:
    parsed = parse_sentinel_url("rediss+sentinel://app:pw@s1:1/mymaster")
    assert parsed.ssl is True
    assert (parsed.username, parsed.password, parsed.db) == ("app", "pw", 0)
    assert is_sentinel_url("REDIS+SENTINEL://h/s")
    assert not is_sentinel_url("redis://h:6379/0")
    assert not is_sentinel_url("rediss://h:6379/0")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://:pw@h1:1", "no service name"),
        ("redis+sentinel://:pw@h1:1/", "no service name"),
        ("redis+sentinel://:pw@/omni", "no sentinel hosts"),
        ("redis+sentinel://:pw@h1:99999/omni", "bad sentinel port"),
        ("redis+sentinel://:pw@h1:x/omni", "bad sentinel port"),
        ("redis+sentinel://:pw@h1,,h2/omni", "empty sentinel host"),
        ("redis+sentinel://:pw@[fd00::1/omni", "bad IPv6"),
        ("redis+sentinel://:pw@h1/omni/zero", "db must be a number"),
        ("redis+sentinel://:pw@h1/omni/0/extra", "too many path parts"),
        ("redis+sentinel://:pw@h1/omni?ssl=true", "unknown option 'ssl'"),
        ("redis+sentinel://pw@h1/omni", "credentials without ':'"),
        ("redis://:pw@h1/omni", "not a Sentinel URL"),
    ],
)
def test_bad_sentinel_urls_are_named_precisely_without_the_password(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        parse_sentinel_url(url)
    assert "pw" not in str(err.value)


def test_connect_builds_a_sentinel_client_without_touching_the_network() -> None:
    client = connect("redis+sentinel://:pw@127.0.0.1:1,127.0.0.1:2/omni/3", timeout_s=0.5)
    assert isinstance(client, aioredis.Redis)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["db"], kwargs["password"], kwargs["socket_timeout"]) == (3, "pw", 0.5)
    assert [c.connection_pool.connection_kwargs["port"] for c in client.via_sentinel.sentinels] == [
        1,
        2,
    ]


def test_connect_passes_tls_and_unix_urls_to_redis_py() -> None:
    tls = connect("rediss://:pw@redis.example:6380/1")
    assert tls.connection_pool.connection_class.__name__ == "SSLConnection"
    unix = connect("unix:///run/redis/redis.sock?db=4")
    assert unix.connection_pool.connection_kwargs["path"] == "/run/redis/redis.sock"
    assert unix.connection_pool.connection_kwargs["db"] == 4


# -- password auth against a real redis-server ---------------------------------------------------


@pytest.fixture(scope="module")
def password_server() -> Iterator[RedisServer]:
    with RedisServer(password=PASSWORD) as server:
        yield server


async def test_fleet_store_works_with_a_password_url(password_server: RedisServer) -> None:
    assert "%20" in password_server.url  # percent-encoded, decoded by redis-py
    store = FleetStore(connect(password_server.url), fleet="auth")
    try:
        assert await store.ping()
        await store.write_record(record("w1"), ttl_ms=5000)
        assert list(await store.snapshot()) == ["w1"]
        assert await store.bind_session("s", "w1", ttl_ms=5000) == "w1"
    finally:
        await store.close()


@pytest.mark.parametrize("password", [None, "wrong"])
async def test_fleet_store_fails_clearly_without_the_right_password(
    password_server: RedisServer, password: str | None
) -> None:
    auth = f":{password}@" if password else ""
    store = FleetStore(connect(f"redis://{auth}127.0.0.1:{password_server.port}/0"))
    try:
        assert await store.ping() is False
        with pytest.raises(redis.AuthenticationError) as err:
            await store.snapshot()
        expected = "invalid username-password" if password else "Authentication required"
        assert expected in str(err.value)
    finally:
        await store.close()


def test_redis_server_extra_args_override_defaults() -> None:
    with RedisServer(extra_args=["--appendonly", "yes", "--maxmemory", "12mb"]) as server:
        client = redis.Redis.from_url(server.url)
        try:
            assert client.config_get("appendonly") == {"appendonly": "yes"}
            assert client.config_get("maxmemory") == {"maxmemory": str(12 * 1024 * 1024)}
        finally:
            client.close()


# -- a real Sentinel -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentinel(password_server: RedisServer) -> Iterator[Sentinel]:
    if not (shutil.which("redis-sentinel") or shutil.which("redis-server")):
        pytest.skip("no redis-sentinel or redis-server binary (apt-get install redis-server)")
    watcher = Sentinel(password_server.port, "omni", PASSWORD)
    try:
        watcher.wait_for_master("omni")
        yield watcher
    finally:
        watcher.stop()


async def test_fleet_store_through_a_sentinel_url(
    sentinel: Sentinel, password_server: RedisServer
) -> None:
    url = f"redis+sentinel://:{quote(PASSWORD, safe='')}@127.0.0.1:{sentinel.port}/omni/5"
    store = FleetStore(connect(url), fleet="sentinel")
    try:
        await store.write_record(record("w9"), ttl_ms=5000)
        assert list(await store.snapshot()) == ["w9"]
        assert await store.bind_session("s", "w9", ttl_ms=5000) == "w9"
        assert await store.move_session("s", "w9", "w10", ttl_ms=5000) == "w10"
        assert await store.affinity_moves() == 1

        # The data is in the master's db 5, where the URL said.
        direct = redis.Redis.from_url(password_server.url.replace("/0", "/5"))
        try:
            assert direct.get(store.keys.affinity("s")) == b"w10"
        finally:
            direct.close()

        # Pub/sub goes through the sentinel-managed pool too.
        events = store.listen()
        first = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.1)  # let the subscription land before publishing
        await store.deregister("w9")
        event = await asyncio.wait_for(first, timeout=5)
        assert event.worker_id == "w9"
        await events.aclose()
    finally:
        await store.close()


async def test_sentinel_url_with_unknown_service_fails_clearly(sentinel: Sentinel) -> None:
    store = FleetStore(connect(f"redis+sentinel://127.0.0.1:{sentinel.port}/nope"))
    try:
        assert await store.ping() is False
        with pytest.raises(MasterNotFoundError, match="nope"):
            await store.snapshot()
    finally:
        await store.close()


# -- Redis Cluster: one fleet, one hash slot -----------------------------------------------------


def test_every_key_of_a_fleet_hashes_to_one_cluster_slot() -> None:
    keys = FleetKeys("prod-eu")
    names = [
        keys.workers,
        keys.worker("w1"),
        keys.load("w1"),
        keys.affinity("session-42"),
        keys.affinity_moves,
        keys.voices,
        keys.voice_audio("alice"),
        keys.events,
        keys.loads,
    ]
    assert {key_slot(name.encode()) for name in names} == {key_slot(b"prod-eu")}
    assert key_slot(FleetKeys("prod-us").workers.encode()) != key_slot(b"prod-eu")


@pytest.fixture
def cluster_node() -> Iterator[RedisServer]:
    """A one-node Redis Cluster owning all 16384 slots: cross-slot checks are as strict as on a
    real cluster. The bus port is chosen explicitly, port+10000 may be out of range."""
    args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
    args += ["--cluster-port", str(free_port()), "--masterauth", PASSWORD]
    with RedisServer(password=PASSWORD, extra_args=args) as server:
        client = redis.Redis.from_url(server.url)
        try:
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            deadline = time.monotonic() + 10
            while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                assert time.monotonic() < deadline, "one-node cluster did not become ok"
                time.sleep(0.05)
        finally:
            client.close()
        yield server


async def test_fleet_store_through_a_cluster_url(cluster_node: RedisServer) -> None:
    url = f"redis+cluster://:{quote(PASSWORD, safe='')}@127.0.0.1:{cluster_node.port}"
    client = connect(url)
    assert isinstance(client, RedisCluster)
    store = FleetStore(client, fleet="c1")
    try:
        await every_store_call(store)
        # Without the hash tag the same transaction is refused by the cluster client.
        with pytest.raises(redis.RedisClusterException, match="same slot"):
            async with client.pipeline(transaction=True) as pipe:
                pipe.set("omni:v1:c1:worker:w1", "x")
                pipe.sadd("omni:v1:c1:workers", "w1")
                await pipe.execute()
    finally:
        await store.close()


def test_cluster_urls_are_parsed_precisely() -> None:
    parsed = parse_cluster_url(
        "rediss+cluster://u:p%40w@n1,n2:7001,[fd00::1]:7002/0?ssl_ca_certs=/ca"
    )
    assert parsed.nodes == (("n1", 6379), ("n2", 7001), ("fd00::1", 7002))
    assert (parsed.username, parsed.password, parsed.ssl) == ("u", "p@w", True)
    assert parsed.options == (("ssl_ca_certs", "/ca"),)
    assert is_cluster_url("redis+cluster://n1") and not is_cluster_url("redis://n1")
    for url, message in [
        ("redis+cluster://:pw@n1/3", "only db 0"),
        ("redis+cluster://:pw@/", "no cluster nodes"),
        ("redis+cluster://:pw@n1:0", "bad cluster node port"),
        ("redis+cluster://:pw@n1?db=1", "unknown option 'db'"),
    ]:
        with pytest.raises(ValueError, match=message) as err:
            parse_cluster_url(url)
        assert "pw" not in str(err.value)


# -- TLS (rediss://) against a real redis-server -------------------------------------------------


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 (EC keys: fast to make)."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
            "-subj", "/CN=omni-test-ca")  # fmt: skip
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "1",
            "-extfile", "san.ext")  # fmt: skip
    return directory / "ca.pem", directory / "server.pem", directory / "server.key"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not on PATH")
async def test_fleet_store_over_tls_with_a_verified_certificate(tmp_path: Path) -> None:
    ca, cert, key = make_certificates(tmp_path)
    tls_port = free_port()
    tls = ["--tls-port", str(tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
           "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"]  # fmt: skip
    # The plain port stays open only for RedisServer's readiness check; clients use TLS.
    with RedisServer(password=PASSWORD, extra_args=tls):
        secret = quote(PASSWORD, safe="")
        url = f"rediss://:{secret}@127.0.0.1:{tls_port}/0?ssl_ca_certs={quote(str(ca))}"
        store = FleetStore(connect(url), fleet="tls")
        try:
            await store.write_record(record("w1"), ttl_ms=5000)
            assert list(await store.snapshot()) == ["w1"]
        finally:
            await store.close()

        # Without the CA the server's certificate cannot be verified: a clear refusal.
        unverified = FleetStore(connect(f"rediss://:{secret}@127.0.0.1:{tls_port}/0"))
        try:
            assert await unverified.ping() is False
            with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
                await unverified.snapshot()
        finally:
            await unverified.close()
        # Plain TCP on the TLS port gets no answer it can use.
        plain = FleetStore(connect(f"redis://:{secret}@127.0.0.1:{tls_port}/0", timeout_s=0.5))
        try:
            assert await plain.ping() is False
        finally:
            await plain.close()


async def test_sentinel_client_follows_a_failover_when_the_master_dies() -> None:
    """Master + replica + one sentinel (quorum 1). The master is killed; the sentinel promotes
    the replica, and the same FleetStore reaches it after a few failed attempts (workers and
    routers retry Redis calls anyway). Nothing acknowledged before the kill is lost here
    because the test waits for the replica to have it (replication is asynchronous)."""
    no_delay = ["--repl-diskless-sync-delay", "0"]  # the default waits 5 s for more replicas
    with RedisServer(password=PASSWORD, extra_args=no_delay) as master:
        replica_args = ["--replicaof", "127.0.0.1", str(master.port), "--masterauth", PASSWORD]
        with RedisServer(password=PASSWORD, extra_args=replica_args) as replica:
            watcher = Sentinel(master.port, "ha", PASSWORD)
            try:
                watcher.wait_for_master("ha")
                url = f"redis+sentinel://:{quote(PASSWORD, safe='')}@127.0.0.1:{watcher.port}/ha"
                store = FleetStore(connect(url, timeout_s=0.5), fleet="ha")
                try:
                    await store.write_record(record("before"), ttl_ms=60_000)
                    deadline = time.monotonic() + 20
                    follower = redis.Redis.from_url(replica.url)
                    while not follower.exists(store.keys.worker("before")):
                        assert time.monotonic() < deadline, "the replica never synced"
                        await asyncio.sleep(0.05)
                    follower.close()

                    master.stop(kill=True)
                    sentinel = redis.Redis(port=watcher.port)
                    while sentinel.sentinel_get_master_addr_by_name("ha")[1] != replica.port:
                        assert time.monotonic() < deadline, "the sentinel did not fail over"
                        await asyncio.sleep(0.1)
                    sentinel.close()
                    while True:
                        try:
                            await store.write_record(record("after"), ttl_ms=60_000)
                            break
                        except (redis.ConnectionError, redis.TimeoutError, OSError):
                            assert time.monotonic() < deadline, "no write after the failover"
                            await asyncio.sleep(0.1)
                    assert set(await store.snapshot()) == {"before", "after"}
                finally:
                    await store.close()
                promoted = redis.Redis.from_url(replica.url)
                try:
                    assert promoted.info("replication")["role"] == "master"
                finally:
                    promoted.close()
            finally:
                watcher.stop()


async def test_the_documented_acl_rule_allows_everything_the_store_does() -> None:
    """docs/redis.md gives an ACL rule for a least-privilege user: check that it suffices for
    every FleetStore call and keeps the user out of other keys."""
    rule = "on >omni-secret ~omni:v1:* &omni:v1:* +@read +@write +@pubsub +@scripting +@transaction +ping"  # noqa: E501
    assert rule in (REPO / "docs" / "redis.md").read_text()
    with RedisServer() as server:
        admin = redis.Redis.from_url(server.url)
        admin.execute_command("ACL", "SETUSER", "omni", *rule.split())
        admin.close()
        store = FleetStore(connect(f"redis://omni:omni-secret@127.0.0.1:{server.port}/0"))
        try:
            await every_store_call(store)
            with pytest.raises(redis.exceptions.NoPermissionError):
                await store.redis.set("other:key", "x")
        finally:
            await store.close()
