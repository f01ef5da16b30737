"""An 80-second soak on the shared live fleet: steady mixed load (chat, streamed chat, speech,
streamed speech, realtime), nothing lost or failed, and every router's and worker's RSS and
open descriptors and Redis's memory flat (tests/reliability/soak.py; the 30-minute run is
``bench/soak.py``, its figures in docs/reliability.md)."""

from __future__ import annotations

import pytest

from tests.reliability.fleet import Fleet
from tests.reliability.soak import soak

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def test_a_soak_is_flat(omni_fleet: Fleet) -> None:
    result = soak(omni_fleet, seconds=80)  # 8 samples, 10 s apart: quarters of 2
    s = result.summary
    assert s.lost == 0 and not s.failed, s
    assert result.realtime_ok >= 10 and not result.realtime_failed, result.realtime_failed
    assert not result.not_flat(), "\n".join(result.not_flat()) + "\n" + result.table()
    print(f"\nsoak {result.seconds:.0f}s: {s}, realtime sessions {result.realtime_ok}")
    print(result.table())
