"""Shared fixtures: one private redis-server per test session (real Redis, free port)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from fleet.redis_server import RedisServer

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A clean database on the session's Redis for each test that asks for one."""
    if redis_server.process is None:  # a test stopped it and did not restart it
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


# The live fleet (redis + omni-workers + omni-routers) shared by the reliability suite, the
# real-client and security tests: one instance per session, started on first use.
from tests.reliability.fixtures import (  # noqa: E402, F401
    omni_fleet,
    omni_fleet_session,
    pytest_collection_modifyitems,
    pytest_runtest_makereport,
)
