"""The one live fleet of a test session, shared by the reliability scenarios, the real-client
tests, the security checks, the fuzzers and the README examples (imported by tests/conftest.py
so that every module gets the same instance)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.reliability.fleet import Fleet

# A fleet already running in this process (a harness that calls pytest.main) is used as is.
SHARED: Fleet | None = None
_RUNNING: Fleet | None = None  # the fleet of this session, once started


@pytest.fixture(scope="session")
def omni_fleet_session() -> Iterator[Fleet]:
    global _RUNNING
    if SHARED is not None:
        _RUNNING = SHARED
        yield SHARED
        return
    fleet = _RUNNING = Fleet().start()
    try:
        yield fleet
    finally:
        _RUNNING = None
        fleet.close()


@pytest.fixture
def omni_fleet(omni_fleet_session: Fleet) -> Fleet:
    """The shared fleet, repaired if an earlier scenario left it short of a worker."""
    return omni_fleet_session.ensure(min_workers=2)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator:
    """A failed test on the live fleet carries the tail of every daemon's log (CI keeps only
    what pytest prints; a fleet's failure usually shows in a worker's or a router's log)."""
    report = yield
    fleet = _RUNNING if "omni_fleet_session" in getattr(item, "fixturenames", ()) else None
    if report.failed and fleet is not None:
        for name, text in fleet.logs().items():
            report.sections.append((f"log of {name} (tail)", "\n".join(text.splitlines()[-40:])))
    return report


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests on the live fleet run last and together: the fleet starts for the first of them
    and is stopped at the end of the session, instead of idling through everybody else's."""
    items.sort(key=lambda item: "omni_fleet_session" in getattr(item, "fixturenames", ()))
