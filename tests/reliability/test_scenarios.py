"""Scenarios 1-7 on the shared live fleet (three tiny-omni workers, two routers, Redis), in an
order that keeps repairs cheap: the scenarios that leave the fleet whole come first, then the
SIGKILL (one worker fewer), the join (one more), the drain (one fewer). Each asserts its own
invariants; see tests/reliability/scenarios.py and docs/reliability.md."""

from __future__ import annotations

import pytest

from tests.reliability import scenarios
from tests.reliability.fleet import Fleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def run(fleet: Fleet, scenario) -> None:
    result = scenario(fleet)
    print(f"\n{result.name}: {result.summary} recovery {result.recovery_s}s {result.notes}")


def test_3_worker_hangs_and_comes_back(omni_fleet_session: Fleet) -> None:
    run(omni_fleet_session, scenarios.worker_hung)


def test_7_stage_process_crash(omni_fleet_session: Fleet) -> None:
    run(omni_fleet_session, scenarios.stage_crashed)


def test_4_redis_killed_and_restarted(omni_fleet_session: Fleet) -> None:
    run(omni_fleet_session, scenarios.redis_restarted)


def test_5_router_restart_keeps_sessions(omni_fleet_session: Fleet) -> None:
    run(omni_fleet_session, scenarios.router_restarted)


def test_1_worker_killed_under_load(omni_fleet_session: Fleet) -> None:
    run(omni_fleet_session, scenarios.worker_killed)


def test_6_worker_joins_under_load(omni_fleet_session: Fleet) -> None:
    run(omni_fleet_session, scenarios.worker_joins)


def test_2_worker_drained(omni_fleet_session: Fleet) -> None:
    run(omni_fleet_session, scenarios.worker_drained)
