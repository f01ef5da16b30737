"""Router building blocks without processes: settings, classification, policies, health."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from pydantic import SecretStr, ValidationError
from pydantic_settings import CliApp

from fleet.errors import OmniError
from fleet.records import Endpoint, LoadReport, Modality, WorkerRecord, WorkerStatus
from router.admission import Admission
from router.auth import ClientAuth, credential
from router.classify import StageClass, classify_json, classify_plain, route_of
from router.health import Breaker, HealthState
from router.metrics import Metrics
from router.policies import (
    choose_hash,
    choose_least_inflight,
    choose_load,
    choose_round_robin,
    load_score,
    over_bound,
)
from router.settings import Policy, RouterSettings
from router.view import FleetView, WorkerState


def settings(**kw: object) -> RouterSettings:
    return RouterSettings(worker=["http://127.0.0.1:9"], **kw)  # type: ignore[arg-type]


def worker(worker_id: str, in_flight: int = 0, capacity: int = 64, **load: dict) -> WorkerState:
    record = WorkerRecord(
        id=worker_id,
        url="http://127.0.0.1:9",
        node="n",
        model="m",
        served_models=["m"],
        capacity=capacity,
        status=WorkerStatus.READY,
    )
    w = WorkerState(record, settings(), static=False)
    w.in_flight = in_flight
    if load:
        w.update_load(LoadReport(worker_id=worker_id, **load))
    return w


def test_cli_flags_repeat_and_validate() -> None:
    s = CliApp.run(
        RouterSettings,
        cli_args=["--worker", "http://127.0.0.1:1", "--worker", "http://localhost:2/",
                  "--policy", "hash", "--api-key", "k-s3cret"],
    )  # fmt: skip
    assert s.worker == ["http://127.0.0.1:1", "http://localhost:2"]
    assert s.policy is Policy.HASH and s.api_key[0].get_secret_value() == "k-s3cret"
    assert "s3cret" not in repr(s)
    with pytest.raises(ValidationError, match="HOST:PORT"):
        RouterSettings(worker=["127.0.0.1:1"])
    with pytest.raises(ValidationError, match="redis-url"):
        RouterSettings()
    with pytest.raises(ValidationError):
        RouterSettings(worker=["http://a:1"], no_such_flag=1)  # type: ignore[call-arg]


def test_classification_reads_routing_fields_only() -> None:
    body = (
        b'{"model":"m","stream":true,"user":"u1","modalities":["text","audio"],'
        b'"messages":[{"role":"user","content":[{"type":"input_audio"}]}]}'
    )
    c = classify_json(Endpoint.CHAT, body, b"application/json; charset=utf-8", True)
    assert (c.model, c.stream, c.session_key, c.stage_class) == ("m", True, "u1", "speech")
    assert c.inputs == {Modality.TEXT, Modality.AUDIO} and Modality.AUDIO in c.outputs
    text = classify_json(Endpoint.CHAT, b'{"model":"m","messages":[]}', b"application/json", True)
    assert text.stage_class == StageClass.TEXT and not text.stream
    for bad, status in ((b"{", 400), (b"[]", 400), (b'{"model":1}', 400)):
        with pytest.raises(OmniError) as err:
            classify_json(Endpoint.CHAT, bad, b"application/json", True)
        assert err.value.status == status
    with pytest.raises(OmniError) as err:
        classify_json(Endpoint.CHAT, b"{}", b"text/plain", True)
    assert err.value.status == 415


def test_responses_are_classified_and_routed_by_their_cache_key() -> None:
    """The Responses API: ``prompt_cache_key`` is the session key, image parts of the input
    items are a modality, and the stored responses' paths take GET and DELETE only."""
    body = (
        b'{"model":"m","prompt_cache_key":"conv-1","input":[{"role":"user","content":'
        b'[{"type":"input_text","text":"hi"},{"type":"input_image","image_url":"data:"}]}]}'
    )
    c = classify_json(Endpoint.RESPONSES, body, b"application/json", False)
    assert (c.model, c.session_key, c.blocks) == ("m", "conv-1", None)
    assert c.inputs == {Modality.TEXT, Modality.IMAGE} and c.stage_class == StageClass.TEXT
    plain = classify_json(
        Endpoint.RESPONSES, b'{"model":"m","input":"hi"}', b"application/json", False
    )
    assert plain.session_key is None and plain.inputs == {Modality.TEXT}
    assert route_of(b"/v1/responses") == (Endpoint.RESPONSES, True, frozenset({b"POST"}))
    stored = route_of(b"/v1/responses/resp-1/input_items")
    assert stored == (Endpoint.RESPONSES, False, frozenset({b"GET", b"DELETE"}))


def test_api_keys_come_as_bearer_or_api_key() -> None:
    auth = ClientAuth([SecretStr("k1")], Metrics())
    for given in (b"Bearer k1", b"bearer  k1 ", b"Api-Key k1", b"api-key k1"):
        assert auth.accepts(given) and credential(given) == b"k1"
    for given in (b"Basic k1", b"Bearer k2", b"Api-Key", b"k1", None):
        assert not auth.accepts(given)


def test_load_score_weights_the_stage_the_request_class_loads() -> None:
    thinker_busy = worker("a", queue_depth={"thinker": 8, "talker": 0})
    talker_busy = worker("b", queue_depth={"thinker": 0, "talker": 8})
    assert load_score(thinker_busy, "text") > load_score(talker_busy, "text")
    assert load_score(talker_busy, "speech") > load_score(thinker_busy, "speech")
    picks = Counter(choose_load([thinker_busy, talker_busy], "text", None).id for _ in range(50))
    assert picks == {"b": 50}  # two candidates: power of two choices always compares both


def test_least_inflight_round_robin_and_rendezvous() -> None:
    ws = [worker("a", 3), worker("b", 1), worker("c", 2)]
    assert choose_least_inflight(ws, "text", None).id == "b"
    order = [choose_round_robin(ws, "text", None).id for _ in range(6)]
    assert sorted(order[:3]) == ["a", "b", "c"] and order[3:] == order[:3]
    # recency order: a changed candidate set continues with its least recently picked member
    first_two = [w for w in order[:3] if w in ("a", "b")]
    assert choose_round_robin(ws[:2], "text", None).id == first_two[0]
    keys = [f"k{i}" for i in range(200)]
    before = {k: choose_hash(ws, "text", k).id for k in keys}
    after = {k: choose_hash([*ws, worker("d")], "text", k).id for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(after[k] == "d" for k in moved)  # a join moves only keys it wins


def test_bounded_load() -> None:
    ws = [worker("a", 10, capacity=10), worker("b", 0, capacity=10), worker("c", 1, capacity=10)]
    assert over_bound(ws[0], ws, "text", 1.25)
    assert not over_bound(ws[1], ws, "text", 1.25)
    idle = [worker("x"), worker("y")]
    assert not over_bound(idle[0], idle, "text", 1.25)
    # low load: one request ahead of an idle peer is within the integer slack, two are not
    assert not over_bound(
        worker("p", 1, capacity=64),
        [worker("p", 1, capacity=64), worker("q", 0, capacity=64)],
        "text",
        1.25,
    )
    assert over_bound(
        worker("p", 3, capacity=64),
        [worker("p", 3, capacity=64), worker("q", 0, capacity=64)],
        "text",
        1.25,
    )


def test_health_thresholds_and_breaker() -> None:
    h = HealthState(healthy_after=2, unhealthy_after=2, breaker_failures=3, breaker_open_s=0.05)
    h.probe_result(False)
    assert h.healthy and h.admits
    assert h.probe_result(False) and not h.healthy and not h.admits
    h.probe_result(True)
    assert not h.healthy
    assert h.probe_result(True) and h.healthy and h.admits
    for _ in range(3):
        h.request_failed("HTTP 500")
    assert h.breaker is Breaker.OPEN and not h.admits
    time.sleep(0.06)
    assert not h.admits and h.breaker is Breaker.HALF_OPEN  # no traffic until a probe passes
    h.probe_result(False)
    assert h.breaker is Breaker.OPEN
    time.sleep(0.06)
    assert not h.admits
    h.probe_result(True)
    assert h.breaker is Breaker.CLOSED and h.admits


def test_admission_reasons() -> None:
    view = FleetView(settings())
    view.upsert(worker("a").record)
    drained = worker("b").record.model_copy(update={"status": WorkerStatus.DRAINING})
    view.upsert(drained)
    adm = Admission(view, max_in_flight=2, retry_after_s=1)
    c = classify_json(Endpoint.CHAT, b'{"model":"nope"}', b"application/json", True)
    with pytest.raises(OmniError) as err:
        adm.admit(c, 0)
    assert err.value.status == 404 and err.value.code.value == "model_not_found"
    view.remove("a")
    c = classify_json(Endpoint.CHAT, b'{"model":"m"}', b"application/json", True)
    with pytest.raises(OmniError) as err:
        adm.admit(c, 0)
    assert err.value.status == 503 and "draining" in err.value.message
    with pytest.raises(OmniError) as err:
        adm.admit(c, 2)
    assert err.value.status == 429


def _family(worker_id: str, model: str, caps: dict) -> WorkerRecord:
    return WorkerRecord.model_validate(
        {"id": worker_id, "url": "http://127.0.0.1:9", "node": "n", "model": model,
         "served_models": [model], "capabilities": caps, "status": "ready"}
    )  # fmt: skip


def test_every_family_is_admitted_for_the_endpoints_its_spec_advertises() -> None:
    """A TTS worker advertises text in, audio out; an ASR worker audio in, text out: speech,
    voices and transcriptions reach them (they were refused 503 no_eligible_worker)."""
    view = FleetView(settings())
    view.upsert(_family("tts", "tts", {"endpoints": ["speech", "voices", "realtime"],
                "input_modalities": ["text"], "output_modalities": ["audio"]}))  # fmt: skip
    view.upsert(_family("asr", "asr", {"endpoints": ["transcription"],
                "input_modalities": ["audio"], "output_modalities": ["text"]}))  # fmt: skip
    view.upsert(_family("omni", "omni", {"endpoints": ["chat", "speech", "transcription"],
                "input_modalities": ["text", "audio", "image"],
                "output_modalities": ["text", "audio"]}))  # fmt: skip
    adm = Admission(view, max_in_flight=8, retry_after_s=1)

    def served_by(c) -> set[str]:
        return {w.id for w in adm.admit(c, 0)[0]}

    speech = b'{"model":"tts","input":"hi","voice":"v"}'
    c = classify_json(Endpoint.SPEECH, speech, b"application/json", True)
    assert (c.inputs, c.outputs) == ({Modality.TEXT}, {Modality.AUDIO})
    assert served_by(c) == {"tts"}
    anonymous = classify_json(Endpoint.SPEECH, b'{"input":"x"}', b"application/json", True)
    assert served_by(anonymous) == {"tts", "omni"}
    assert served_by(classify_plain(Endpoint.VOICES)) == {"tts"}
    assert served_by(classify_plain(Endpoint.TRANSCRIPTION)) == {"asr", "omni"}
    # a chat asking for audio out still needs a worker with text out as well
    chat = b'{"model":"tts","messages":[],"modalities":["text","audio"]}'
    with pytest.raises(OmniError) as err:
        adm.admit(classify_json(Endpoint.CHAT, chat, b"application/json", True), 0)
    assert err.value.status == 404  # the TTS worker serves no chat


def test_metrics_use_fixed_label_vocabularies() -> None:
    m = Metrics()
    m.request("chat", 200, 0.01)
    text = m.render().decode()
    assert 'omni_router_requests_total{route="chat",status_class="2xx"} 1.0' in text
    assert 'omni_router_request_duration_seconds_bucket{le="0.025",route="chat"} 1.0' in text


def test_bounded_load_counts_a_report_and_own_requests_once() -> None:
    """The worker's report already counts this router's requests: the larger of the two, not
    their sum, so one request in flight never looks like two."""
    from router.policies import placement_load

    busy = worker("a", 1, queue_depth={"thinker": 1})  # this router's request, also reported
    assert placement_load(busy, "text") == 1.0
    assert placement_load(worker("b", 0, queue_depth={"thinker": 3}), "text") == 3.0  # others'
    # a report alone can hold a session in place or move it; on own counts only it cannot
    hot = worker("h", 0, queue_depth={"thinker": 50})
    pair = [hot, worker("i")]
    assert over_bound(hot, pair, "text", 1.25)
    assert not over_bound(hot, pair, "text", 1.25, reports=False)


def test_bounded_load_counts_requests_not_busy_time() -> None:
    """A worker whose stages were busy until a moment ago (a session's previous request) but
    hold nothing now is not over the bound at idle load; the load policy still prefers the
    idle peer for a request without a session."""
    just_done = worker("a", 0, queue_depth={"thinker": 0}, busy={"thinker": 0.9, "talker": 0.9})
    idle = [worker("b", 0, queue_depth={"thinker": 0}), worker("c", 0, queue_depth={"thinker": 0})]
    fleet = [just_done, *idle]
    assert not over_bound(just_done, fleet, "text", 1.25)
    assert not over_bound(just_done, fleet, "speech", 1.25)
    assert load_score(just_done, "text") > load_score(idle[0], "text")
    two_queued = worker("a", 0, queue_depth={"thinker": 2}, busy={"thinker": 0.9})
    assert over_bound(two_queued, [two_queued, *idle], "text", 1.25)  # requests still count


def test_client_headers_one_reader_for_http_and_websocket() -> None:
    from router.http.headers import read_client_headers

    headers = [
        (b"connection", b"keep-alive, X-Secret"),
        (b"x-secret", b"hop"),
        (b"x-kept", b"end"),
        (b"x-omni-session", b"s1"),  # an internal name as the session header: matched, dropped
        (b"authorization", b"Bearer k"),
        (b"content-type", b"application/json"),
        (b"transfer-encoding", b"chunked"),
    ]
    fwd, auth, ctype, session = read_client_headers(headers, b"x-omni-session", keep_auth=False)
    assert session == b"s1" and auth == b"Bearer k" and ctype == b"application/json"
    assert b"".join(fwd) == b"x-kept: end\r\ncontent-type: application/json\r\n"
    fwd, _, _, session = read_client_headers(headers, b"x-session-id", keep_auth=True)
    assert b"authorization: Bearer k\r\n" in b"".join(fwd) and session is None


def test_connection_cap_leaves_the_reserve() -> None:
    from router.resources import connection_cap

    assert connection_cap(0, 256, 20_000) == (20_000 - 256) // 3
    assert connection_cap(500, 256, 20_000) == 500  # explicit wins
    assert connection_cap(0, 256, 300) == 16  # never below a usable minimum


def test_retry_backoff_is_full_jitter_doubling() -> None:
    from router.dispatch import retry_backoff

    for attempt, ceiling in ((1, 0.02), (2, 0.04), (3, 0.08)):
        assert all(0 <= retry_backoff(0.02, attempt) <= ceiling for _ in range(200))
