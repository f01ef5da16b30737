"""The soak by hand: a fresh live fleet (Redis, three tiny-omni workers, two routers), a steady
mixed load for ``--minutes`` (30 by default), memory, descriptors and Redis memory sampled every
10 s; prints the table of docs/reliability.md and exits 1 if anything failed or grew.

    python bench/soak.py --minutes 30
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.reliability.fleet import Fleet
from tests.reliability.soak import soak


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--every-s", type=float, default=10.0, help="seconds between samples")
    a = p.parse_args()
    fleet = Fleet().start()
    try:
        result = soak(fleet, a.minutes * 60, a.every_s)
    finally:
        fleet.close()
    s = result.summary
    print(
        f"soak {result.seconds:.0f} s, {len(result.samples)} samples: sent {s.sent}, ok {s.ok}, "
        f"failed {s.failed_text()}, lost {s.lost}; realtime sessions {result.realtime_ok} ok, "
        f"{len(result.realtime_failed)} failed"
    )
    print(result.table())
    bad = result.not_flat()
    for line in bad + result.realtime_failed[:10]:
        print("NOT OK:", line)
    return 1 if bad or s.lost or s.failed or result.realtime_failed else 0


if __name__ == "__main__":
    sys.exit(main())
