"""omni-router over static workers (no Redis): proxying, streaming passthrough, bad inputs,
load spreading, admission limits, API keys and secrets. Real router and fake-worker processes."""

from __future__ import annotations

import hashlib
import socket
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleet.api_keys import api_key_id
from fleet.redis_server import free_port
from tests.fakes.procs import FakeWorker, Router, chat, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def workers() -> Iterator[list[FakeWorker]]:
    ws = [
        FakeWorker("w1", "--chunks", "5", "--chunk-delay-ms", "150", "--voices", "alloy"),
        FakeWorker("w2", "--chunks", "5", "--chunk-delay-ms", "150", "--model", "fake-model",
                   "--model", "other-model", "--endpoints", "speech", "voices",
                   "--outputs", "audio", "--voices", "alloy", "echo"),
    ]  # fmt: skip
    yield ws
    for w in ws:
        w.stop()


@pytest.fixture(scope="module")
def router(workers: list[FakeWorker]) -> Iterator[Router]:
    r = Router(*(a for w in workers for a in ("--worker", w.url)), "--max-body-bytes", "65536")
    yield r
    r.stop()


def worker_health_clean(router: Router) -> None:
    for w in router.diagnostics()["workers"]:
        assert w["health"]["healthy"] and w["health"]["breaker"] == "closed", w
        assert w["health"]["consecutive_failures"] == 0, w


def test_chat_is_proxied_with_request_and_worker_ids(router: Router, workers) -> None:
    r = chat(router.url)
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "ok"
    rid, wid = r.headers["x-omni-request-id"], r.headers["x-omni-worker-id"]
    assert r.headers["x-fake-worker"] == "1"  # worker headers pass through
    assert "keep-alive" not in r.headers.get("connection", "")  # hop-by-hop stripped
    port = int(wid.rsplit(":", 1)[1])
    chosen = next(w for w in workers if w.port == port)
    assert rid in chosen.stats()["request_ids"]


def test_client_cannot_inject_internal_headers(router: Router, workers) -> None:
    r = chat(router.url, headers={"x-omni-worker-token": "forged", "x-omni-request-id": "forged"})
    assert r.status_code == 200 and r.headers["x-omni-request-id"] != "forged"
    for w in workers:
        assert "forged" not in w.stats()["headers_seen"]["x-omni-worker-token"]


def test_sse_events_arrive_as_the_worker_sends_them(router: Router) -> None:
    body = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    received: list[tuple[float, dict | str]] = []
    with httpx.stream("POST", router.url + "/v1/chat/completions", json=body, timeout=10) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                received.append((time.time(), data if data == "[DONE]" else orjson.loads(data)))
    events = [e for _, e in received if isinstance(e, dict)]
    assert [e["i"] for e in events] == [0, 1, 2, 3, 4] and received[-1][1] == "[DONE]"
    # the first event reached the client before the worker had even produced the last one
    assert received[0][0] < events[-1]["t"]


def test_chunked_audio_passes_through_incrementally(router: Router) -> None:
    t_chunks: list[float] = []
    total = 0
    body = {"model": "fake-model", "input": "hello", "voice": "alloy"}
    with httpx.stream("POST", router.url + "/v1/audio/speech", json=body, timeout=10) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm"
        assert "content-length" not in r.headers
        for piece in r.iter_raw():
            t_chunks.append(time.monotonic())
            total += len(piece)
    assert total == 5 * 4800
    # chunks were 150 ms apart at the worker: the first was not held back until the end
    assert t_chunks[-1] - t_chunks[0] > 0.3


def _histogram(router: Router, name: str, route: str) -> tuple[float, float]:
    """(count, sum) of one route's histogram on the router's /metrics, over its other labels
    (the first-byte times are also by model: "*" for a static worker)."""
    found = {"count": 0.0, "sum": 0.0}
    metrics = httpx.get(router.url + "/metrics", timeout=5).text
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            for part in found:
                if sample.name == f"omni_router_{name}_{part}" and sample.labels["route"] == route:
                    found[part] += sample.value
    return found["count"], found["sum"]


def test_time_to_first_byte_is_a_histogram_per_route_and_model(router: Router) -> None:
    """A stream of five chunks 150 ms apart: its first byte within a chunk's time, its end
    after the other four."""
    first = _histogram(router, "first_byte_seconds", "speech")
    whole = _histogram(router, "request_duration_seconds", "speech")
    body = {"model": "fake-model", "input": "hello", "voice": "alloy"}
    with httpx.stream("POST", router.url + "/v1/audio/speech", json=body, timeout=10) as r:
        assert r.status_code == 200
        for _ in r.iter_raw():
            pass
    count, seconds = _histogram(router, "first_byte_seconds", "speech")
    assert count == first[0] + 1 and seconds - first[1] < 0.15
    metrics = httpx.get(router.url + "/metrics", timeout=5).text
    models = {
        sample.labels["model"]
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "omni_router_first_byte_seconds_count"
    }
    assert models == {"*"}  # by the worker's model: a static worker's record names none
    count, seconds = _histogram(router, "request_duration_seconds", "speech")
    assert count == whole[0] + 1 and seconds - whole[1] >= 0.55


def test_models_are_merged_over_the_fleet(router: Router) -> None:
    """Each model with what its workers say of it: capabilities and voices, merged."""
    data = httpx.get(router.url + "/v1/models", timeout=5).json()["data"]
    models = {m["id"]: m for m in data}
    assert set(models) == {"fake-model", "other-model"}
    fake = models["fake-model"]
    assert fake["voices"] == ["alloy", "echo"]  # union, in the order the workers list them
    assert fake["capabilities"] == {
        "endpoints": ["chat", "speech", "transcription", "voices", "realtime"],
        "input_modalities": ["text", "audio"],
        "output_modalities": ["text", "audio"],
        "streaming": True,
    }
    assert models["other-model"]["capabilities"]["endpoints"] == ["speech", "voices"]
    one = httpx.get(router.url + "/v1/models/other-model", timeout=5)
    assert one.status_code == 200 and one.json() == models["other-model"]
    missing = httpx.get(router.url + "/v1/models/nope", timeout=5)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_bad_inputs_get_4xx_and_never_mark_a_worker_unhealthy(router: Router) -> None:
    url = router.url + "/v1/chat/completions"
    bad_json = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "invalid_json"
    not_object = httpx.post(url, content=b"[1]", headers={"content-type": "application/json"})
    assert not_object.status_code == 400
    wrong_type = httpx.post(url, content=b"model=x", headers={"content-type": "text/plain"})
    assert wrong_type.status_code == 415
    assert wrong_type.json()["error"]["code"] == "unsupported_media_type"
    huge = httpx.post(url, content=b"x" * 200_000, headers={"content-type": "application/json"})
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "body_too_large"
    for _ in range(8):  # more than the breaker threshold: 4xx from workers never count
        unknown = chat(router.url, model="no-such-model")
        assert unknown.status_code == 404
    get_chat = httpx.get(url)
    assert get_chat.status_code == 405
    with socket.create_connection(("127.0.0.1", router.port), timeout=5) as sock:
        sock.sendall(b"BLAH / HTTP/1.1\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 400")
    time.sleep(1.2)  # a probe round
    worker_health_clean(router)
    assert chat(router.url).status_code == 200


def test_stream_broken_after_headers_ends_with_an_sse_error_event(router, workers) -> None:
    for w in workers:
        w.control("break", {"after": 2})
    body = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    lines = []
    with httpx.stream("POST", router.url + "/v1/chat/completions", json=body, timeout=10) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert len(lines) == 3
    assert orjson.loads(lines[-1][6:])["error"]["code"] == "stream_interrupted"
    # audio: the chunked body is cut, so the client sees an incomplete body
    for w in workers:
        w.control("break", {"after": 2})
    body = {"model": "fake-model", "input": "hello"}
    url = router.url + "/v1/audio/speech"
    with (
        pytest.raises(httpx.RemoteProtocolError),
        httpx.stream("POST", url, json=body, timeout=10) as r,
    ):
        assert r.status_code == 200
        for _ in r.iter_raw():
            pass
    for w in workers:
        w.control("break", {"after": None})
    assert 'code="stream_interrupted"' in router.metrics()


def test_load_policy_spreads_by_speed() -> None:
    fast = FakeWorker("fast", "--delay-ms", "5")
    slow = FakeWorker("slow", "--delay-ms", "150")
    router = Router("--worker", fast.url, "--worker", slow.url, name="router-skew")
    try:

        def run(_: int) -> int:
            return sum(chat(router.url).status_code == 200 for _ in range(12))

        with ThreadPoolExecutor(6) as pool:
            assert sum(pool.map(run, range(6))) == 72
        n_fast, n_slow = fast.stats()["requests"], slow.stats()["requests"]
        assert n_fast + n_slow == 72
        assert n_fast > 3 * n_slow, (n_fast, n_slow)
    finally:
        router.stop()
        fast.stop()
        slow.stop()


def test_admission_limits_answer_429_with_retry_after() -> None:
    slow = FakeWorker("slow429", "--delay-ms", "1500")  # long enough to overlap under load
    router = Router("--worker", slow.url, "--max-in-flight", "2", name="router-429")
    capped = Router("--worker", slow.url, "--static-capacity", "1", name="router-cap")
    try:
        for r, code in ((router, "rate_limited"), (capped, "overloaded")):
            with ThreadPoolExecutor(4) as pool:
                results = list(pool.map(lambda _, u=r.url: chat(u), range(4)))
            statuses = sorted(x.status_code for x in results)
            assert 200 in statuses and 429 in statuses, statuses
            rejected = next(x for x in results if x.status_code == 429)
            assert rejected.headers["retry-after"] == "1"
            assert rejected.json()["error"]["code"] == code
    finally:
        router.stop()
        capped.stop()
        slow.stop()


def test_no_routable_worker_is_503_with_a_reason() -> None:
    w = FakeWorker("dying")
    router = Router("--worker", w.url, "--probe-interval-s", "0.2", name="router-503")
    try:
        assert chat(router.url).status_code == 200
        w.control("health", {"healthy": False})
        wait_for(lambda: not router.ready()["ready"], 5)
        r = chat(router.url)
        assert r.status_code == 503
        err = r.json()["error"]
        assert err["code"] == "no_eligible_worker" and "failing health probes" in err["message"]
        w.control("health", {"healthy": True})
        wait_for(lambda: chat(router.url).status_code == 200, 5)
    finally:
        router.stop()
        w.stop()


def test_api_keys_worker_token_and_no_secrets_in_diagnostics_or_metrics(workers) -> None:
    router = Router(
        "--worker", workers[0].url, "--api-key", "client-key-s3cret", "--api-key", "second-key",
        "--worker-token", "worker-token-s3cret", name="router-keys",
    )  # fmt: skip
    try:
        before = workers[0].stats()["requests"]
        assert chat(router.url).status_code == 401
        bad = chat(router.url, headers={"authorization": "Bearer nope"})
        assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
        assert workers[0].stats()["requests"] == before  # no worker was touched
        ok = chat(router.url, headers={"authorization": "Bearer second-key"})
        assert ok.status_code == 200
        seen = workers[0].stats()["headers_seen"]
        assert seen["x-omni-worker-token"][-1] == "worker-token-s3cret"
        assert "Bearer second-key" not in seen["authorization"]  # the router's key stays here
        # voice uploads carry the key's id (never the key): workers charge per-key quotas to it;
        # a client cannot claim another key's id
        up = httpx.post(
            router.url + "/v1/audio/voices",
            headers={"authorization": "Bearer second-key", "x-omni-api-key-id": "forged"},
            files={"file": ("v.wav", b"RIFF")},
            data={"name": "v"},
        )
        assert up.status_code == 200, up.text
        seen = workers[0].stats()["headers_seen"]
        assert seen["x-omni-api-key-id"][-1] == api_key_id("second-key")
        assert httpx.get(router.url + "/diagnostics").status_code == 401
        diag = httpx.get(
            router.url + "/diagnostics", headers={"authorization": "Bearer client-key-s3cret"}
        ).text
        assert orjson.loads(diag)["router"]["api_keys"] == 2
        for text in (diag, router.metrics(), router.output()):
            assert "s3cret" not in text and "second-key" not in text
    finally:
        router.stop()


def test_connect_failure_is_retried_on_another_worker(workers) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    router = Router("--worker", dead, "--worker", workers[0].url, "--policy", "round_robin",
                    "--unhealthy-after", "100", name="router-retry")  # fmt: skip
    try:
        results = [chat(router.url) for _ in range(10)]
        assert all(r.status_code == 200 for r in results)
        assert {r.headers["x-omni-worker-id"] for r in results} == {f"127.0.0.1:{workers[0].port}"}
        assert 'omni_router_policy_outcomes_total{outcome="retried"}' in router.metrics()
        assert 'outcome="retried"} 0.0' not in router.metrics()
    finally:
        router.stop()


def test_headers_and_idle_timeouts() -> None:
    slow_head = FakeWorker("slowhead", "--delay-ms", "3000")
    slow_chunks = FakeWorker("slowchunks", "--chunks", "3", "--chunk-delay-ms", "3000")
    router = Router("--worker", slow_head.url, "--headers-timeout-s", "0.4", name="router-hto")
    idle = Router("--worker", slow_chunks.url, "--idle-timeout-s", "0.4", name="router-ito")
    try:
        r = chat(router.url)
        assert r.status_code == 504 and r.json()["error"]["code"] == "worker_timeout"
        body = {"model": "fake-model", "stream": True, "messages": []}
        with httpx.stream("POST", idle.url + "/v1/chat/completions", json=body, timeout=10) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert len(lines) == 2
        assert orjson.loads(lines[-1][6:])["error"]["code"] == "stream_interrupted"
    finally:
        router.stop()
        idle.stop()
        slow_head.stop()
        slow_chunks.stop()


def test_redis_password_never_shows(workers) -> None:
    port = free_port()  # no Redis there: the router runs on its static worker and says so
    url = f"redis://user:hunter2-pw@127.0.0.1:{port}/0"
    router = Router("--redis-url", url, "--worker", workers[0].url, name="router-pw")
    try:
        assert chat(router.url).status_code == 200
        diag = router.diagnostics()
        assert diag["redis"]["url"] == f"redis://user:***@127.0.0.1:{port}/0"
        assert diag["redis"]["state"] == "unreachable"
        for text in (orjson.dumps(diag).decode(), router.metrics(), router.output()):
            assert "hunter2" not in text
    finally:
        router.stop()
    assert "hunter2" not in router.output()


def test_uploads_stream_to_the_worker_without_buffering(workers) -> None:
    big = Router("--worker", workers[0].url, name="router-upload")
    payload = [bytes([i]) * 200_000 for i in range(4)]
    digest = hashlib.sha256(b"".join(payload)).hexdigest()
    sent_last: list[float] = []

    def body() -> Iterator[bytes]:
        for i, piece in enumerate(payload):
            if i == len(payload) - 1:
                time.sleep(0.5)
                sent_last.append(time.time())
            yield piece

    headers = {"content-type": "multipart/form-data; boundary=x"}
    url = big.url + "/v1/audio/transcriptions"
    try:
        r = httpx.post(url, content=body(), headers=headers, timeout=10)  # chunked upload
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["bytes"] == 800_000 and doc["sha256"] == digest and doc["chunked"]
        # the worker had the request before the client sent the last piece: no buffering
        assert doc["t_head"] < sent_last[0]
        r = httpx.post(url, content=b"".join(payload), headers=headers, timeout=10)
        assert r.status_code == 200 and r.json()["sha256"] == digest
        assert not r.json()["chunked"]  # Content-Length framing kept
        assert chat(big.url).status_code == 200  # the connection state is clean afterwards
    finally:
        big.stop()


def rss_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):  # noqa: SIM115
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_slow_client_slows_the_worker_instead_of_filling_router_memory() -> None:
    # 60 MB of audio as fast as the worker can write it, to a client that stops reading
    big = FakeWorker("bigaudio", "--chunks", "120", "--chunk-bytes", "500000")
    router = Router("--worker", big.url, name="router-backpressure")
    try:
        before = rss_bytes(router.p.pid)
        body = {"model": "fake-model", "input": "long"}
        with httpx.stream("POST", router.url + "/v1/audio/speech", json=body, timeout=30) as r:
            assert r.status_code == 200
            pieces = r.iter_raw(65536)
            total = len(next(pieces))
            time.sleep(1.5)  # not reading: the router must stop reading the worker
            grown = rss_bytes(router.p.pid) - before
            assert grown < 16_000_000, grown
            total += sum(len(p) for p in pieces)
        assert total == 120 * 500_000
    finally:
        router.stop()
        big.stop()


def test_a_large_body_to_a_slow_client_stays_exact_while_other_bodies_flow() -> None:
    """Worker responses are read into one shared buffer (router.http.proxy._ReadBuffer); a
    large body that a slow client has not taken yet must not be overwritten by the bodies read
    for other clients meanwhile."""
    from tests.reliability.hostile import RawWorker

    size = 16_000_000  # beyond what the kernel buffers for a client that does not read
    worker = RawWorker(body=bytes(size), varying=True)  # each answer one byte value of its own
    router = Router("--worker", worker.url, name="router-slow-raw")
    try:
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", router.port))
        slow.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nhost: x\r\ncontent-type: "
                     b"application/json\r\ncontent-length: 2\r\n\r\n{}")  # fmt: skip
        time.sleep(0.5)  # its answer waits in the router, not read
        with httpx.Client(timeout=10) as client:
            for _ in range(5):
                r = client.post(router.url + "/v1/audio/speech", json={})
                assert r.status_code == 200 and len(r.content) == size
                assert len(set(r.content)) == 1
        slow.settimeout(10)
        got = b""
        while b"\r\n\r\n" not in got:
            got += slow.recv(65536)
        head, _, body = got.partition(b"\r\n\r\n")
        while len(body) < size:
            piece = slow.recv(1 << 20)
            assert piece, len(body)
            body += piece
        assert head.startswith(b"HTTP/1.1 200") and len(body) == size
        assert set(body) == {1}, Counter(body).most_common(3)  # the first answer, intact
        slow.close()
    finally:
        router.stop()
        worker.close()


def test_circuit_breaker_opens_on_5xx_and_half_opens_to_a_probe() -> None:
    bad, good = FakeWorker("bad"), FakeWorker("good")
    router = Router("--worker", bad.url, "--worker", good.url, "--policy", "round_robin",
                    "--breaker-failures", "3", "--breaker-open-s", "4", "--probe-interval-s",
                    "0.2", name="router-breaker")  # fmt: skip
    bad_id = f"127.0.0.1:{bad.port}"
    try:
        bad.control("fail", {"status": 500})  # /health stays fine: only real requests fail
        statuses = [chat(router.url).status_code for _ in range(12)]
        assert statuses.count(500) == 3  # passed through, then the circuit opened
        workers = {w["id"]: w for w in router.diagnostics()["workers"]}
        assert workers[bad_id]["health"]["breaker"] == "open"
        assert "omni_router_workers_circuit_open 1.0" in router.metrics()
        bad.control("fail", {"status": 0})
        # after breaker-open-s (long enough for the twelve requests above on a loaded box), a
        # passing probe closes it and the worker gets traffic again
        wait_for(lambda: any(chat(router.url).headers["x-omni-worker-id"] == bad_id
                             for _ in range(4)), 15)  # fmt: skip
    finally:
        router.stop()
        bad.stop()
        good.stop()


def test_unserved_openai_apis_are_refused_with_a_clear_404(router: Router, workers) -> None:
    before = sum(w.stats()["requests"] for w in workers)
    r = httpx.post(router.url + "/v1/embeddings", json={"model": "fake-model", "input": "hi"})
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["code"] == "endpoint_not_served" and "embeddings" in error["message"]
    assert sum(w.stats()["requests"] for w in workers) == before  # no worker was asked


def test_large_length_delimited_bodies_pass_through_exactly_on_reused_connections() -> None:
    """Bodies of 16 KB and more are relayed without the parser (router.http.proxy.RAW_MIN);
    the pooled worker connection must still frame the next response right."""
    from tests.reliability.hostile import RawWorker

    body = bytes(range(256)) * 800  # 200 KB, every byte value
    worker = RawWorker(body=body)
    router = Router("--worker", worker.url, name="router-raw")
    try:
        with httpx.Client(timeout=10) as client:
            for i in range(6):
                r = client.post(router.url + "/v1/audio/speech", json={"input": f"x{i}"})
                assert r.status_code == 200 and r.content == body
                assert r.headers["content-length"] == str(len(body))
                h = client.head(router.url + "/live")  # a small answer between large ones
                assert h.status_code in (200, 404, 405)
        small = chat(router.url)
        assert small.status_code == 200 and small.content == body
        assert len(worker.heads) == 7
    finally:
        router.stop()
        worker.close()
