"""Run the fault-injection scenarios on a fresh live fleet and print the table of figures:
sent / ok / failed (by status and code) / lost / recovery time, one row per scenario.

    python bench/reliability_report.py [--markdown] [--only 1,2,8]

Rows 1-7 are the load scenarios of tests/reliability/scenarios.py (the same functions the test
suite runs, with the same invariants: a row says FAIL and why when one does not hold). Rows 8
and 9 run the bad-input and fuzzing tests with pytest on the same fleet; their counts are the
routers' own request counters (omni_router_requests_total) over the run, plus what went to the
worker called directly. Numbers depend on the machine; run it by hand, not in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from tests.reliability import fixtures, scenarios  # noqa: E402
from tests.reliability.fleet import Fleet  # noqa: E402
from tests.reliability.load import Summary  # noqa: E402

LOAD_SCENARIOS = [
    ("3", scenarios.worker_hung),
    ("7", scenarios.stage_crashed),
    ("4", scenarios.redis_restarted),
    ("5", scenarios.router_restarted),
    ("1", scenarios.worker_killed),
    ("6", scenarios.worker_joins),
    ("2", scenarios.worker_drained),
]
PYTEST_SCENARIOS = [
    ("8", "8 bad inputs (router + worker)", "tests/reliability/test_bad_inputs.py"),
    ("9", "9 fuzzing (hypothesis)", "tests/test_fuzz_http.py"),
]
_REQ = re.compile(r'^omni_router_requests_total\{route="(\w+)",status_class="(\w+)"\} (\S+)$', re.M)
_WREQ = re.compile(r'^omni_worker_requests_total\{route="(\w+)",status="(\w+)"\} (\S+)$', re.M)


def counters(fleet: Fleet) -> Counter:
    """API requests answered so far, by status class, over every router and worker (admin
    calls, health probes and load reads left out: the tests and the routers make those)."""
    out: Counter = Counter()
    for r in fleet.routers:
        for route, cls, n in _REQ.findall(httpx.get(r.url + "/metrics", timeout=5).text):
            if route != "admin":
                out[f"router {cls}"] += float(n)
    for w in fleet.workers.values():
        for route, cls, n in _WREQ.findall(httpx.get(w.url + "/metrics", timeout=5).text):
            if route != "other":
                out[f"worker {cls}"] += float(n)
    return out


def row_for_pytest(fleet: Fleet, name: str, path: str) -> dict:
    import pytest

    fixtures.SHARED = fleet
    before = counters(fleet)
    started = time.monotonic()
    with contextlib.redirect_stdout(sys.stderr):  # the table alone goes to stdout
        code = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:timeout", path])
    delta = counters(fleet) - before
    routed = sum(v for k, v in delta.items() if k.startswith("router"))
    ok = sum(v for k, v in delta.items() if k == "router 2xx")
    failed = {
        k.split()[1]: int(v)
        for k, v in delta.items()
        if k.startswith("router") and k != "router 2xx"
    }
    direct = sum(v for k, v in delta.items() if k.startswith("worker"))
    return {
        "name": name,
        "sent": int(routed),
        "ok": int(ok),
        "failed": ", ".join(f"{k}: {v}" for k, v in sorted(failed.items())) or "-",
        "lost": "-",
        "recovery": "-",
        "verdict": "pass" if code == 0 else f"FAIL (pytest exit {int(code)})",
        "notes": f"API requests through the routers (their counters); {int(direct)} API "
        f"answers by workers, direct calls included ({time.monotonic() - started:.0f}s)",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--only", default="", help="comma-separated scenario numbers")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    started = time.monotonic()
    fleet = Fleet().start()
    print(f"fleet up in {time.monotonic() - started:.0f}s", file=sys.stderr)
    rows = []
    try:
        for number, scenario in LOAD_SCENARIOS:
            if only and number not in only:
                continue
            t = time.monotonic()
            try:
                r = scenario(fleet)
                s, verdict = r.summary, "pass"
                row = {"name": r.name, "recovery": f"{r.recovery_s:.2f}s ({r.recovery_what})",
                       "notes": "; ".join(r.notes)}  # fmt: skip
            except AssertionError as exc:
                s, verdict = Summary(0, 0), "FAIL: " + str(exc).splitlines()[0][:120]
                row = {"name": scenario.__name__, "recovery": "-", "notes": ""}
                fleet.ensure(2)
            row |= {"sent": s.sent, "ok": s.ok, "failed": s.failed_text(), "lost": s.lost,
                    "verdict": verdict}  # fmt: skip
            row["notes"] += f" ({time.monotonic() - t:.0f}s)"
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
        for number, name, path in PYTEST_SCENARIOS:
            if only and number not in only:
                continue
            fleet.ensure(2)
            rows.append(row_for_pytest(fleet, name, path))
            print(rows[-1], file=sys.stderr, flush=True)
    finally:
        fleet.close()
    rows.sort(key=lambda r: int(r["name"].split()[0]) if r["name"][0].isdigit() else 99)
    cols = ["name", "sent", "ok", "failed", "lost", "recovery", "verdict", "notes"]
    if args.markdown:
        print(
            "| scenario | sent | ok | failed (status code: n) | lost | recovery | verdict | notes |"
        )
        print("|---|---:|---:|---|---:|---|---|---|")
        for r in rows:
            print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    else:
        for r in rows:
            print("  ".join(f"{c}={r[c]}" for c in cols))
    return 0 if all(r["verdict"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
