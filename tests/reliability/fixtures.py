"""The one live fleet of a test session, shared by the reliability scenarios, the real-client
tests, the security checks, the fuzzers and the README examples (imported by tests/conftest.py
so that every module gets the same instance)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.reliability.fleet import Fleet

# A fleet already running in this process (a harness that calls pytest.main) is used as is.
SHARED: Fleet | None = None


@pytest.fixture(scope="session")
def omni_fleet_session() -> Iterator[Fleet]:
    if SHARED is not None:
        yield SHARED
        return
    fleet = Fleet().start()
    try:
        yield fleet
    finally:
        fleet.close()


@pytest.fixture
def omni_fleet(omni_fleet_session: Fleet) -> Fleet:
    """The shared fleet, repaired if an earlier scenario left it short of a worker."""
    return omni_fleet_session.ensure(min_workers=2)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests on the live fleet run last and together: the fleet starts for the first of them
    and is stopped at the end of the session, instead of idling through everybody else's."""
    items.sort(key=lambda item: "omni_fleet_session" in getattr(item, "fixturenames", ()))
