"""Security checks on the live fleet (API keys at the router, a router-to-worker token, a
password-protected Redis): unauthenticated requests reach no worker, workers refuse requests
that do not come through a router, worker records pointing at non-HTTP or link-local/metadata
addresses are refused by the routers, and no secret shows in logs, metrics or diagnostics."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from fleet.records import Capabilities, EventKind, FleetEvent, WorkerRecord, WorkerStatus
from router.discovery import url_refusal
from tests.reliability.fleet import KEYS, MODEL, Fleet, wait_until

# the first test on the live fleet also waits for it to start (minutes on a busy machine)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CHAT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def worker_requests(fleet: Fleet) -> dict[str, float]:
    """Each worker's own count of API requests it answered (its /metrics is open); route
    "other" (health probes, load reports) is left out: routers probe all the time."""
    pattern = re.compile(r'^omni_worker_requests_total\{route="(\w+)"[^}]*\} (\S+)$', re.M)
    out = {}
    for wid, w in fleet.workers.items():
        text = httpx.get(w.url + "/metrics", timeout=5).text
        out[wid] = sum(float(n) for route, n in pattern.findall(text) if route != "other")
    return out


def test_without_a_valid_api_key_401_and_no_worker_reached(omni_fleet: Fleet) -> None:
    before = worker_requests(omni_fleet)
    assert before, "the worker exports omni_worker_requests_total"
    attempts = [
        ("POST", "/v1/chat/completions", {}),
        ("POST", "/v1/chat/completions", {"Authorization": "Bearer sk-wrong"}),
        ("POST", "/v1/chat/completions", {"Authorization": f"Basic {omni_fleet.api_key}"}),
        ("POST", "/v1/chat/completions", {"Authorization": f"Bearer {omni_fleet.api_key}x"}),
        ("POST", "/v1/chat/completions", {"x-omni-worker-token": omni_fleet.worker_token}),
        ("POST", "/v1/audio/speech", {}),
        ("POST", "/v1/audio/transcriptions", {}),
        ("GET", "/v1/audio/voices", {}),
        ("GET", "/v1/models", {}),
        ("GET", "/diagnostics", {}),
    ]
    for r in omni_fleet.routers:
        for method, path, headers in attempts:
            resp = httpx.request(method, r.url + path, headers=headers, json=CHAT, timeout=10)
            assert resp.status_code == 401, (path, headers, resp.text)
            assert resp.json()["error"]["code"] == "invalid_api_key"
            assert resp.headers["www-authenticate"] == "Bearer"
            assert "x-omni-worker-id" not in resp.headers
        ws = httpx.get(
            r.url + "/v1/realtime",
            headers={
                "connection": "upgrade",
                "upgrade": "websocket",
                "sec-websocket-version": "13",
                "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
            },
            timeout=10,
        )
        assert ws.status_code == 401
    assert worker_requests(omni_fleet) == before, "an unauthenticated request reached a worker"
    # the same request with the key goes through
    ok = httpx.post(
        omni_fleet.routers[0].url + "/v1/chat/completions",
        headers=omni_fleet.auth,
        json=CHAT,
        timeout=30,
    )
    assert ok.status_code == 200, ok.text


def test_worker_refuses_requests_that_do_not_come_through_a_router(omni_fleet: Fleet) -> None:
    w = next(iter(omni_fleet.workers.values()))
    for headers in (
        {},
        {"x-omni-worker-token": "wrong"},
        {"Authorization": "Bearer wrong"},
        omni_fleet.auth,  # the client API key is not the worker token
    ):
        for method, path in (
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/audio/speech"),
            ("GET", "/v1/models"),
            ("GET", "/v1/audio/voices"),
            ("GET", "/load"),
        ):
            resp = httpx.request(method, w.url + path, headers=headers, json=CHAT, timeout=10)
            assert resp.status_code == 401, (path, headers, resp.text)
            assert resp.json()["error"]["code"] == "invalid_api_key"
    # probes stay open; the token (what routers send) is accepted
    assert httpx.get(w.url + "/health", timeout=5).status_code == 200
    direct = httpx.post(
        w.url + "/v1/chat/completions", headers=omni_fleet.worker_auth, json=CHAT, timeout=30
    )
    assert direct.status_code == 200, direct.text


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "gopher://127.0.0.1:70/",
        "ftp://127.0.0.1:21/",
        "unix:///run/worker.sock",
        "127.0.0.1:8100",
        "http://169.254.169.254/latest/meta-data/",
        "http://169.254.0.1:8100",
        "http://[fd00:ec2::254]/",
        "http://[fe80::1]:8100",
        "http://[::ffff:169.254.169.254]:80",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://METADATA.GOOGLE.INTERNAL./",
        "http://127.0.0.1:notaport",
    ],
)
def test_url_refusal_rules(url: str) -> None:
    assert url_refusal(url) is not None


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8100", "https://worker-3.example.internal:8443", "http://[::1]:9"]
)
def test_url_admitted(url: str) -> None:
    assert url_refusal(url) is None


def test_router_refuses_worker_records_with_dangerous_urls(omni_fleet: Fleet) -> None:
    """Records planted in Redis (as a compromised or misconfigured node could) with non-HTTP or
    metadata URLs never enter a router's view; a well-formed one planted beside them does, so
    the refusal is about the URL and nothing else."""
    client = omni_fleet.redis_client()
    planted = {
        "evil-file": "file:///etc/passwd",
        "evil-imds": "http://169.254.169.254/latest/meta-data/",
        "evil-ec2v6": "http://[fd00:ec2::254]/",
        "evil-gce": "http://metadata.google.internal/computeMetadata/v1/",
        "control": "http://127.0.0.1:9",
    }
    try:
        for wid, url in planted.items():
            record = WorkerRecord(
                id=wid,
                url=url,
                node="planted",
                model=MODEL,
                served_models=[MODEL],
                capabilities=Capabilities(),
                # draining: the control record is listed but never routed to
                status=WorkerStatus.DRAINING,
            )
            client.set(KEYS.worker(wid), record.model_dump_json(), px=20_000)
            client.sadd(KEYS.workers, wid)
            event = FleetEvent(kind=EventKind.DRAINING, worker_id=wid)
            client.publish(KEYS.events, event.model_dump_json())
        # and one record no router can read: it must not hide the others (nor look like an
        # unreachable Redis)
        client.set(KEYS.worker("garbage"), b'{"id": 5, "url": ["x"]}', px=20_000)
        client.sadd(KEYS.workers, "garbage")
        for r in omni_fleet.routers:
            wait_until(
                lambda r=r: "control" in {w["id"] for w in omni_fleet.diagnostics(r)["workers"]},
                10,
                "the control record is in the view",
            )
            time.sleep(1.2)  # at least two resyncs after the events
            listed = {w["id"]: w["url"] for w in omni_fleet.diagnostics(r)["workers"]}
            assert not {k for k in listed if k.startswith("evil-")}, listed
            assert "refusing worker evil-imds" in r.output()
            assert httpx.get(r.url + "/ready", timeout=5).json()["redis"] == "ok"
    finally:
        for wid in [*planted, "garbage"]:
            client.delete(KEYS.worker(wid))
            client.srem(KEYS.workers, wid)
            client.publish(
                KEYS.events, FleetEvent(kind=EventKind.LEFT, worker_id=wid).model_dump_json()
            )
        client.close()
    for r in omni_fleet.routers:
        wait_until(
            lambda r=r: "control" not in {w["id"] for w in omni_fleet.diagnostics(r)["workers"]},
            10,
            "the control record is gone",
        )


def test_secrets_never_in_logs_metrics_or_diagnostics(omni_fleet: Fleet) -> None:
    # make sure the daemons have had something to say: requests, a refused one, an error
    httpx.post(omni_fleet.routers[0].url + "/v1/chat/completions", json=CHAT, timeout=10)
    httpx.post(
        omni_fleet.routers[1].url + "/v1/chat/completions",
        headers=omni_fleet.auth,
        json=CHAT,
        timeout=30,
    )
    documents = dict(omni_fleet.logs())
    for r in omni_fleet.routers:
        documents[f"{r.name} /metrics"] = r.metrics()
        documents[f"{r.name} /diagnostics"] = httpx.get(
            r.url + "/diagnostics", headers=omni_fleet.auth, timeout=5
        ).text
        documents[f"{r.name} /ready"] = httpx.get(r.url + "/ready", timeout=5).text
    for wid, w in omni_fleet.workers.items():
        for path in ("/metrics", "/health", "/ready", "/load", "/v1/models"):
            documents[f"worker {wid} {path}"] = httpx.get(
                w.url + path, headers=omni_fleet.worker_auth, timeout=5
            ).text
    assert all(documents.values())
    for name, secret in omni_fleet.secrets.items():
        leaks = [doc for doc, text in documents.items() if secret in text]
        assert not leaks, f"the {name} appears in: {leaks}"
    # the Redis URL is shown, redacted
    diag = omni_fleet.diagnostics(omni_fleet.routers[0])
    assert diag["redis"]["url"] == f"redis://***@127.0.0.1:{omni_fleet.redis.port}/0"
