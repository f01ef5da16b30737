"""The router's live fleet page (``/dashboard``) and its JSON (``/dashboard/state``).

The end-to-end test drives the page in headless Chromium (Debian's ``chromium``) against a
real local fleet (``omni-router --local-workers 2``, tiny-omni workers, the embedded Redis) and
checks what a person would see: the workers and their plan, numbers moving under load, a
killed worker turning unhealthy and then gone. ``OMNI_DASHBOARD_SCREENSHOT=PATH`` also saves
a screenshot taken under load there, near the end of ``OMNI_DASHBOARD_LOAD_S`` seconds of load
(docs/screenshots/dashboard.png comes from it).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

import httpx
import pytest

from fleet.records import WorkerRecord, WorkerStatus
from fleet.store import FleetStore, connect
from tests.chromium import Browser, chromium_binary
from tests.fakes.procs import FakeWorker, Router, chat, wait_for
from tests.local_fleet_procs import REPO, LocalFleetProcess, descendants, still_running


@pytest.fixture
def browser():
    if chromium_binary() is None:
        reason = "chromium is not installed (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(reason + ": CI must run the dashboard test")
        pytest.skip(reason)
    b = Browser(width=1440, height=1000)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def fake_fleet(redis_url):
    workers = [FakeWorker(f"fw{i}", redis_url=redis_url) for i in range(2)]
    router = Router("--redis-url", redis_url)
    try:
        wait_for(lambda: router.ready()["routable_workers"] == 2, 15)
        yield router, workers
    finally:
        router.stop()
        for w in workers:
            w.stop()


# -- the page and its JSON, against fake workers ------------------------------------------------


def test_the_page_is_one_self_contained_document(fake_fleet):
    router, _ = fake_fleet
    for path in ("/dashboard", "/dashboard/"):
        r = httpx.get(router.url + path, timeout=5)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/html")
        assert r.headers["cache-control"] == "no-store"
    page = r.text
    assert "<script>" in page and "<style>" in page
    # nothing fetched from anywhere else: no external scripts, styles, fonts or images
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.I)
    assert not re.search(r"""url\(\s*["']?(https?:)?//|@import|<link\b""", page, re.I)
    assert re.search(r"""fetch\(stateUrl""", page)
    assert httpx.get(router.url + "/dashboard/nope", timeout=5).status_code == 404


def test_the_state_has_workers_traffic_errors_and_affinity(fake_fleet):
    router, _ = fake_fleet
    for i in range(6):
        assert chat(router.url, extra={"user": f"user-{i % 3}"}).status_code == 200
    assert chat(router.url, model="no-such-model").status_code == 404

    def state() -> dict:
        return httpx.get(router.url + "/dashboard/state", timeout=5).json()

    # bindings come from Redis in the background, at most every 2 s
    doc = wait_for(lambda: (d := state())["affinity"]["bindings"] == 3 and d, 10)
    assert {w["id"] for w in doc["workers"]} == {"fw0", "fw1"}
    assert sum(w["bindings"] for w in doc["workers"]) == 3
    w = doc["workers"][0]
    assert w["node"] == "fake-node" and "chat" in w["endpoints"] and w["status"] == "ready"
    assert w["load"] is not None and "health" in w
    m = doc["metrics"]
    assert "admin" not in m["routes"]  # the dashboard's own polling is not traffic
    assert m["requests"]["chat"]["2xx"] == 6 and m["requests"]["chat"]["4xx"] == 1
    assert sum(m["hist"]["chat"]) == 7 and len(m["hist"]["chat"]) == len(m["buckets"]) + 1
    assert {"route": "chat", "code": "model_not_found", "count": 1} in m["errors"]
    assert doc["affinity"]["outcomes"]["new"] == 3 and doc["affinity"]["outcomes"]["hit"] == 3
    assert doc["affinity"]["moves"] == 0
    # the fake workers' one model, idle: the minimum (computed every second)
    (signal,) = wait_for(lambda: state()["scaling"], 5)
    assert signal["ready_replicas"] == 2 and signal["desired_replicas"] == 1
    assert doc["plans"] == {}  # fake workers publish no plan
    assert doc["router"]["listen"].endswith(f":{router.port}")


def test_the_state_needs_an_api_key_exactly_when_diagnostics_does(redis_url):
    worker = FakeWorker("fw", redis_url=redis_url)
    router = Router("--redis-url", redis_url, "--api-key", "sekret")
    try:
        assert httpx.get(router.url + "/dashboard", timeout=5).status_code == 200  # no data in it
        assert httpx.get(router.url + "/dashboard/state", timeout=5).status_code == 401
        assert httpx.get(router.url + "/diagnostics", timeout=5).status_code == 401
        ok = httpx.get(
            router.url + "/dashboard/state", headers={"authorization": "Bearer sekret"}, timeout=5
        )
        assert ok.status_code == 200 and "workers" in ok.json()
    finally:
        router.stop()
        worker.stop()


# -- what a person sees, in Chromium, against a real local fleet --------------------------------


def _number(text: str) -> float:
    match = re.search(r"-?[\d,]+(\.\d+)?", text)
    assert match, f"no number in {text!r}"
    return float(match.group(0).replace(",", ""))


class Load:
    """A bounded load loop: chat with sessions, speech, and a few bad requests."""

    def __init__(self, url: str, seconds: float, threads: int = 4) -> None:
        self.url = url
        self.stop_at = time.monotonic() + seconds
        self.status: Counter[int] = Counter()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self, i: int) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            k = 0
            while time.monotonic() < self.stop_at:
                k += 1
                if k % 10 == 0:
                    r = client.post("/v1/chat/completions", json={"model": "nope", "messages": []})
                elif k % 3 == 0:
                    r = client.post(
                        "/v1/audio/speech",
                        json={"model": "tiny-omni", "input": f"hello {k}", "voice": "chelsie"},
                    )
                else:
                    r = client.post(
                        "/v1/chat/completions",
                        json={
                            "model": "tiny-omni",
                            "messages": [{"role": "user", "content": f"hi {k}"}],
                            "max_tokens": 12,
                            "user": f"user-{i}-{k % 4}",
                        },
                    )
                self.status[r.status_code] += 1

    def join(self) -> Counter[int]:
        for t in self.threads:
            t.join(120)
        return self.status


@pytest.mark.slow
def test_a_person_watching_the_dashboard_sees_the_fleet_live(browser, tmp_path):
    fleet = LocalFleetProcess(2, "--local-redis", "embedded")
    try:
        fleet.wait_ready()
        assert "not for production" in fleet.banner_field("redis")
        started = descendants(fleet.proc.pid)
        page = browser.open(fleet.url + "/dashboard")

        # the workers, ready, and their plan
        page.wait_for("document.querySelectorAll('#workers tr[data-status=ready]').length == 2")
        workers = page.text("#workers")
        assert "local-0" in workers and "local-1" in workers and "healthy" in workers
        for stage in ("thinker", "talker", "code2wav"):
            assert stage in workers  # per-stage load
        assert page.text("#c-workers") == "2 / 2"
        # the scaling signal: tiny-omni, two ready, idle (the minimum of one needed)
        page.wait_for("!!document.querySelector('#scaling tr[data-model=\"tiny-omni\"]')")
        scaling = page.text("#scaling")
        assert "tiny-omni" in scaling and "minimum" in scaling
        page.wait_for("document.querySelectorAll('#plans svg rect').length > 5")
        plans = page.text("#plans")
        assert "local-0, local-1" in plans  # one plan, both workers
        assert "0/thinker" in plans and "0/talker" in plans
        assert "tiny-omni: fits" in page.eval("document.querySelector('#plans svg').textContent")
        assert "live" in page.text("#live-text")
        assert page.eval("getComputedStyle(document.querySelector('#error')).display") == "none"

        # numbers move under load
        page.wait_for("document.querySelector('#c-total').innerText !== '–'")
        total_before = _number(page.text("#c-total"))
        load = Load(fleet.url, seconds=float(os.environ.get("OMNI_DASHBOARD_LOAD_S", "15")))
        page.wait_for(
            f"parseFloat(document.querySelector('#c-total').innerText.replace(/,/g, '')) >= "
            f"{total_before + 20}",
            timeout=60,
        )
        page.wait_for("parseFloat(document.querySelector('#c-rate').innerText) > 0", timeout=20)
        page.wait_for("document.querySelector('#c-lat').innerText.includes('ms')", timeout=20)
        page.wait_for("!!document.querySelector('#routes tr[data-route=speech]')", timeout=30)
        # the workers' audio replies: real-time factor and underrun share, from their reports
        page.wait_for("document.querySelector('#workers').innerText.includes('RTF')", timeout=30)
        page.wait_for("parseInt(document.querySelector('#c-errors').innerText) > 0", timeout=30)
        page.wait_for("parseInt(document.querySelector('#c-bindings').innerText) > 0", timeout=30)
        routes = page.text("#routes")
        assert "chat" in routes and "speech" in routes
        assert "model_not_found" in page.text("#errors")
        requests_seen = page.eval(
            "[...document.querySelectorAll('#workers tr[data-status=ready] td:nth-child(8)')]"
            ".map(td => parseInt(td.innerText.replace(/,/g, '')))"
        )
        assert sum(requests_seen) > 0, requests_seen
        cached = page.eval(  # the cache-aware policy's share per worker, once chats went there
            "[...document.querySelectorAll('#workers tr[data-status=ready] td:nth-child(7)')]"
            ".map(td => td.innerText)"
        )
        assert any("%" in text and "blocks" in text for text in cached), cached
        time.sleep(2)  # a few more seconds of the traffic chart
        shot = page.screenshot(tmp_path / "dashboard.png")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        if os.environ.get("OMNI_DASHBOARD_SCREENSHOT"):  # late in the load: a fuller chart
            time.sleep(max(0.0, load.stop_at - time.monotonic() - 3))
            page.screenshot(Path(os.environ["OMNI_DASHBOARD_SCREENSHOT"]))
        status = load.join()
        assert status[200] > 0 and status[404] > 0, status
        assert set(status) <= {200, 404}, status

        # a killed worker turns unhealthy, then is gone; the fleet keeps serving
        os.killpg(fleet.worker_pid("local-1"), signal.SIGKILL)
        seen: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status_now = page.eval(
                "(document.querySelector('#workers tr[data-worker=\"local-1\"]') || {})"
                ".dataset?.status || 'missing'"
            )
            if not seen or seen[-1] != status_now:
                seen.append(str(status_now))
            if status_now == "gone":
                break
            time.sleep(0.1)
        assert seen[-1] == "gone", seen
        assert "ready" not in seen[1:], seen  # never back to ready once it went
        assert "gone" in page.text('#workers tr[data-worker="local-1"]')
        page.wait_for("document.querySelector('#c-workers').innerText === '1 / 1'", timeout=10)
        wait_for(lambda: "worker local-1 exited with -9" in fleet.log(), 10)  # the launcher says so
        r = httpx.post(
            fleet.url + "/v1/chat/completions",
            json={"model": "tiny-omni", "messages": [{"role": "user", "content": "still?"}]},
            timeout=60,
        )
        assert r.status_code == 200 and r.headers["x-omni-worker-id"] == "local-0"

        assert page.eval("getComputedStyle(document.querySelector('#error')).display") == "none"

        assert fleet.interrupt(timeout=90) == 0, fleet.log()
        page.wait_for("document.querySelector('#live-text').innerText.includes('unreachable')")
        deadline = time.monotonic() + 10
        while still_running(started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not still_running(started), fleet.log()
        print(f"worker local-1 killed: the page showed {' -> '.join(seen)}")
    finally:
        fleet.close()


def _stage_rects(svg: str) -> list[tuple[str, str]]:
    """(fill, "stage category") of each memory rectangle of a plan picture, in drawing order."""
    root = ElementTree.fromstring(svg)
    out = []
    for rect in root.iter("{http://www.w3.org/2000/svg}rect"):
        title = rect.find("{http://www.w3.org/2000/svg}title")
        if title is not None and not title.text.startswith("reserved"):
            what = title.text.split(":")[0]  # "0/thinker weights" (omni-plan) or "thinker weights"
            out.append((rect.get("fill"), what.split("/", 1)[-1]))
    return out


def test_the_plan_is_drawn_like_omni_plan_svg(browser, redis_url):
    """A GPU worker's plan on the page: the same bars, stacks and colours as ``omni-plan --svg``."""
    from planner.api import plan_spec  # the tests may use the planner; the router may not
    from planner.render import plan_svg

    plan = plan_spec(REPO / "configs/models/qwen3-omni-30b-a3b-speech.yaml", "2xH100-80GB").plan
    assert plan.fits and len(plan.nodes[0].gpus) == 2
    record = WorkerRecord(
        id="gpu-node-1", url="http://127.0.0.1:9", node="gpu-node-1", model=plan.spec,
        served_models=[plan.spec], status=WorkerStatus.READY, plan_digest=plan.digest(),
        plan=plan.model_dump(mode="json"),
    )  # fmt: skip

    async def register() -> None:
        store = FleetStore(connect(redis_url))
        await store.write_record(record, 120_000)
        await store.close()

    asyncio.run(register())
    router = Router("--redis-url", redis_url)
    try:
        page = browser.open(router.url + "/dashboard")
        page.wait_for("document.querySelectorAll('#plans svg rect').length > 5")
        drawn = str(page.eval("document.querySelector('#plans svg').outerHTML"))
        expected = plan_svg(plan)
        assert len(_stage_rects(expected)) >= 8  # 5 stages, weights and KV cache and more
        assert _stage_rects(drawn) == _stage_rects(expected)
        for label in ("GPU 0", "GPU 1", "H100-80GB", f"{plan.spec}: fits, 1 replica(s)"):
            assert label in drawn and label in expected
        table = page.text("#plans table")
        for process in plan.nodes[0].processes:
            assert process.name in table
        assert "gpu 0" in table and "gpu 1" in table
    finally:
        router.stop()
