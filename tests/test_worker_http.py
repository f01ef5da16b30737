"""The worker's HTTP layer in-process over real HTTP on 127.0.0.1, against the test-only
FakePipeline (tests/worker_fakes.py): request shapes, every kind of bad input, token auth,
body limits, abort on disconnect. The real pipeline is covered by test_worker_e2e.py."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import uvicorn
from worker_fakes import FakePipeline

from fleet.records import WorkerStatus
from fleet.store import FleetStore, connect
from planner.spec import ModelSpec
from worker.api.app import create_app
from worker.daemon import _Server, bind
from worker.service import WorkerService
from worker.settings import WorkerSettings

TOKEN = "s3cret-token"

SPEC = ModelSpec.model_validate(
    {
        "name": "fake-omni",
        "model_dir": ".",
        "capabilities": {
            "endpoints": ["chat", "speech", "transcription", "voices"],
            "input_modalities": ["text", "audio"],
            "output_modalities": ["text", "audio"],
        },
        "entry": "thinker",
        "stages": {"thinker": {"executor": "autoregressive", "terminal": True}},
    }
)


def wav_bytes(seconds: float, rate: int = 16_000, freq: float = 440.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


@dataclass
class Running:
    url: str
    service: WorkerService
    pipeline: FakePipeline
    loop: asyncio.AbstractEventLoop

    def call(self, fn, *args) -> None:
        self.loop.call_soon_threadsafe(fn, *args)


def serve_in_thread(
    settings: WorkerSettings, redis_url: str | None = None, spec: ModelSpec = SPEC
) -> Iterator[Running]:
    pipeline = FakePipeline()
    service = WorkerService(settings, spec, pipeline, "w-test")
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    loop = asyncio.new_event_loop()
    server = _Server(uvicorn.Config(create_app(service), log_level="warning", lifespan="off"))

    async def main() -> None:
        if redis_url:
            service.store = FleetStore(connect(redis_url), "http-test")
        await pipeline.start(lambda _m: None)
        service.set_status(WorkerStatus.READY)
        await server.serve(sockets=[sock])

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "in-process worker did not start"
        time.sleep(0.02)
    try:
        yield Running(f"http://127.0.0.1:{port}", service, pipeline, loop)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def worker(redis_server) -> Iterator[Running]:
    settings = WorkerSettings(
        _cli_parse_args=[], token=TOKEN, max_body_bytes=200_000, max_audio_seconds=2.0
    )
    yield from serve_in_thread(settings, redis_server.url)


@pytest.fixture
def http(worker: Running) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=worker.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    ) as client:
        yield client


@pytest.fixture
def sdk(worker: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=worker.url + "/v1", api_key=TOKEN, max_retries=0, timeout=10)


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    assert body["error"]["type"]
    return body["error"]


def test_chat_via_sdk(sdk: openai.OpenAI) -> None:
    out = sdk.chat.completions.create(
        model="fake-omni", messages=[{"role": "user", "content": "hello there"}]
    )
    assert out.choices[0].message.content == "echo hello there"
    assert out.choices[0].finish_reason == "stop"
    assert out.usage is not None and out.usage.completion_tokens == 3


def test_chat_stream_via_sdk(sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="fake-omni",
        messages=[{"role": "user", "content": "a b c"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "echo a b c"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_chat_audio_out_and_in(sdk: openai.OpenAI) -> None:
    clip = base64.b64encode(wav_bytes(0.5)).decode()
    out = sdk.chat.completions.create(
        model="fake-omni",
        modalities=["text", "audio"],
        audio={"voice": "tiny", "format": "wav"},
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hi"},
                    {"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}},
                ],
            }
        ],
    )
    message = out.choices[0].message
    assert message.content == "echo hi +8000 samples"
    assert message.audio is not None and message.audio.transcript == message.content
    pcm, rate = sf.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="int16")
    assert rate == 24_000 and pcm.size == 3 * 2400


def test_speech_whole_and_streamed(sdk: openai.OpenAI, http: httpx.Client) -> None:
    whole = sdk.audio.speech.create(
        model="fake-omni", input="say this", voice="tiny", response_format="wav"
    ).content
    assert whole[:4] == b"RIFF" and len(whole) == 44 + 3 * 2400 * 2
    with http.stream(
        "POST",
        "/v1/audio/speech",
        json={
            "model": "fake-omni",
            "input": "say this",
            "voice": "tiny",
            "stream": True,
            "response_format": "pcm",
        },
    ) as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        pieces = list(response.iter_bytes())
    assert b"".join(pieces) == whole[44:]


def _metric(http: httpx.Client, name: str) -> float:
    """One sample's value on the worker's /metrics (0 when absent)."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_audio_replies_report_real_time_factor_and_underruns(http: httpx.Client) -> None:
    """A reply's real-time factor (admission to its last chunk over its audio seconds) and
    whether it fell behind real time: three 0.1 s chunks 0.3 s apart (LAG) underrun a player
    that started at the first; the same chunks at once do not."""
    kind = '{kind="speech",model="fake-omni"}'  # (the model: the spec's name)
    replies = _metric(http, "omni_worker_audio_replies_total" + kind)
    underruns = _metric(http, "omni_worker_audio_underruns_total" + kind)
    rtf_sum = _metric(http, "omni_worker_real_time_factor_sum" + kind)
    body = {"model": "fake-omni", "voice": "tiny", "response_format": "pcm", "stream": True}
    for text in ("say this", "LAG this"):
        r = http.post("/v1/audio/speech", json={**body, "input": text})
        assert r.status_code == 200 and len(r.content) == 3 * 2400 * 2
    assert _metric(http, "omni_worker_audio_replies_total" + kind) == replies + 2
    assert _metric(http, "omni_worker_audio_underruns_total" + kind) == underruns + 1
    # the lagging reply took at least 0.9 s for 0.3 s of audio: a factor of 3 or more
    assert _metric(http, "omni_worker_real_time_factor_sum" + kind) - rtf_sum >= 3.0
    # the load report (routers, the dashboard) carries the recent ones: their median factor
    # and the share that underran (other tests' replies may be in the window too)
    load = http.get("/load").json()
    assert load["rtf"] is not None and load["rtf"] > 0
    assert 0 < load["underrun_share"] < 1


def test_transcription_via_sdk(sdk: openai.OpenAI) -> None:
    out = sdk.audio.transcriptions.create(
        model="fake-omni", file=("a.wav", wav_bytes(1.25), "audio/wav")
    )
    assert out.text == "heard 1.25 seconds"


def test_bad_inputs(worker: Running, http: httpx.Client) -> None:
    chat = "/v1/chat/completions"
    msgs = [{"role": "user", "content": "x"}]
    headers = {"content-type": "application/json"}
    assert_error(http.post(chat, content=b"{not json", headers=headers), 400, "invalid_json")
    err = assert_error(
        http.post(chat, json={"model": "fake-omni", "messages": "x"}), 400, "invalid_request"
    )
    assert err["param"] == "messages"
    assert_error(
        http.post(chat, json={"model": "fake-omni", "messages": msgs, "max_tokens": "a"}),
        400,
        "invalid_request",
    )
    assert_error(http.post(chat, json={"model": "nope", "messages": msgs}), 404, "model_not_found")
    assert_error(
        http.post(chat, content=b"hi", headers={"content-type": "text/plain"}),
        415,
        "unsupported_media_type",
    )
    ghost = {
        "model": "fake-omni",
        "messages": msgs,
        "modalities": ["text", "audio"],
        "audio": {"voice": "ghost"},
    }
    assert_error(http.post(chat, json=ghost), 400, "voice_not_found")
    garbage = base64.b64encode(b"RIFF....garbage").decode()
    part = {"type": "input_audio", "input_audio": {"data": garbage, "format": "wav"}}
    assert_error(
        http.post(
            chat, json={"model": "fake-omni", "messages": [{"role": "user", "content": [part]}]}
        ),
        400,
        "invalid_audio",
    )
    long = base64.b64encode(wav_bytes(3.0)).decode()
    part = {"type": "input_audio", "input_audio": {"data": long, "format": "wav"}}
    assert_error(
        http.post(
            chat, json={"model": "fake-omni", "messages": [{"role": "user", "content": [part]}]}
        ),
        400,
        "audio_too_long",
    )
    # a declared oversize body is refused before it is read; a chunked one while it arrives
    assert_error(http.post(chat, content=b"x" * 300_000, headers=headers), 413, "body_too_large")

    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b" " * 10_000

    assert_error(http.post(chat, content=chunks(), headers=headers), 413, "body_too_large")
    speech = "/v1/audio/speech"
    assert_error(
        http.post(speech, json={"model": "fake-omni", "input": "x", "voice": "ghost"}),
        400,
        "voice_not_found",
    )
    assert_error(
        http.post(
            speech,
            json={"model": "fake-omni", "input": "x", "voice": "tiny", "response_format": "wma"},
        ),
        400,
        "invalid_request",
    )
    tr = "/v1/audio/transcriptions"
    model = {"model": "fake-omni"}
    assert_error(
        http.post(tr, files={"file": ("a.wav", b"not audio")}, data=model), 400, "invalid_audio"
    )
    assert_error(
        http.post(tr, data={"model": "fake-omni"}, files={"x": ("a", b"1")}), 400, "invalid_request"
    )
    assert_error(http.post(tr, json={"model": "fake-omni"}), 415, "unsupported_media_type")
    assert_error(http.get("/v1/nothing"), 404, "not_found")
    assert_error(http.put("/v1/chat/completions"), 405, "method_not_allowed")
    # the stage failure of one request does not stop the worker serving the next
    assert_error(
        http.post(
            chat, json={"model": "fake-omni", "messages": [{"role": "user", "content": "FAIL"}]}
        ),
        503,
        "stage_failed",
    )
    # a stage refusing the request's content is the client's error, not the worker's
    assert_error(
        http.post(
            chat, json={"model": "fake-omni", "messages": [{"role": "user", "content": "REFUSE"}]}
        ),
        400,
        "invalid_request",
    )
    ok = http.post(chat, json={"model": "fake-omni", "messages": msgs})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "echo x"
    metrics = http.get("/metrics").text
    assert 'omni_worker_errors_total{code="invalid_json"} 1.0' in metrics
    assert 'omni_worker_errors_total{code="body_too_large"} 2.0' in metrics


def test_token_auth(worker: Running) -> None:
    with httpx.Client(base_url=worker.url, timeout=10) as anon:
        for path in ("/health", "/ready", "/metrics"):
            assert anon.get(path).status_code == 200, path
        assert_error(anon.get("/v1/models"), 401, "invalid_api_key")
        assert_error(
            anon.get("/load", headers={"Authorization": "Bearer wrong"}), 401, "invalid_api_key"
        )
        ok = anon.get("/v1/models", headers={"x-omni-worker-token": TOKEN})
        assert ok.status_code == 200 and ok.json()["data"][0]["id"] == "fake-omni"
    bad = openai.OpenAI(base_url=worker.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_voices_stored_in_redis(worker: Running, http: httpx.Client, redis_server) -> None:
    up = http.post(
        "/v1/audio/voices", data={"name": "me"}, files={"file": ("v.wav", wav_bytes(0.5))}
    )
    assert up.status_code == 200, up.text
    names = {v["name"]: v["builtin"] for v in http.get("/v1/audio/voices").json()["data"]}
    assert names == {"tiny": True, "alloy": True, "me": False}
    # another worker on the same Redis and fleet serves it
    other_settings = WorkerSettings(_cli_parse_args=[])
    for other in serve_in_thread(other_settings, redis_server.url):
        r = httpx.post(
            other.url + "/v1/audio/speech",
            timeout=10,
            json={"model": "fake-omni", "input": "x", "voice": "me"},
        )
        assert r.status_code == 200, r.text
        assert other.pipeline.seen[-1].voice_audio is not None
        assert other.pipeline.seen[-1].voice_audio.size == 8000
    assert_error(
        http.post("/v1/audio/voices", data={"name": "bad"}, files={"file": ("v.wav", b"nope")}),
        400,
        "invalid_audio",
    )
    short = {"file": ("v.wav", wav_bytes(0.1))}
    assert_error(
        http.post("/v1/audio/voices", data={"name": "../x"}, files=short), 400, "invalid_request"
    )
    assert http.delete("/v1/audio/voices/me").json()["deleted"] is True
    assert_error(http.delete("/v1/audio/voices/me"), 404, "voice_not_found")


def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.mark.parametrize("stream", [False, True])
def test_abort_on_disconnect(worker: Running, stream: bool) -> None:
    worker.call(worker.pipeline.hold.clear)
    try:
        body = {
            "model": "fake-omni",
            "stream": stream,
            "messages": [{"role": "user", "content": "HOLD please"}],
        }
        before = len(worker.pipeline.aborted)
        sock = socket.create_connection(("127.0.0.1", int(worker.url.rsplit(":", 1)[1])))
        data = httpx.Request(
            "POST",
            worker.url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in data.headers.items() if k.lower() != "host"
        )
        sock.sendall(head.encode() + b"\r\n" + data.read())
        wait_for(lambda: worker.service.in_flight == 1 and len(worker.pipeline.running) == 1)
        sock.close()
        wait_for(lambda: worker.service.in_flight == 0 and not worker.pipeline.running)
        assert len(worker.pipeline.aborted) == before + 1
        load = httpx.get(worker.url + "/load", headers={"Authorization": f"Bearer {TOKEN}"}).json()
        assert load["in_flight"] == 0 and load["queue_depth"] == {"thinker": 0}
    finally:
        worker.call(worker.pipeline.hold.set)


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (WorkerStatus.STARTING, "worker_unavailable"),
        (WorkerStatus.DRAINING, "draining"),
    ],
)
def test_not_serving_refuses_new_requests(
    worker: Running, http: httpx.Client, status: WorkerStatus, code: str
) -> None:
    worker.service.set_status(status)
    try:
        assert_error(http.get("/ready"), 503, code)
        assert http.get("/health").json()["worker_status"] == status.value
        chat = {"model": "fake-omni", "messages": [{"role": "user", "content": "x"}]}
        assert_error(http.post("/v1/chat/completions", json=chat), 503, code)
    finally:
        worker.service.set_status(WorkerStatus.READY)
    assert http.get("/ready").status_code == 200


def test_speech_sse_events(http: httpx.Client) -> None:
    body = {"model": "fake-omni", "input": "a b", "voice": "alloy", "stream_format": "sse"}
    with http.stream("POST", "/v1/audio/speech", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in response.iter_lines() if line]
    assert [e["type"] for e in events] == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
    assert len(base64.b64decode(events[0]["audio"])) == 2400 * 2


def test_stage_failure_mid_stream_is_an_sse_error(sdk: openai.OpenAI) -> None:
    stream = sdk.chat.completions.create(
        model="fake-omni", messages=[{"role": "user", "content": "FAIL now"}], stream=True
    )
    with pytest.raises(openai.APIError) as err:
        list(stream)
    assert err.value.code == "stage_failed"


def test_sessions_and_capacity_in_the_load_report(worker: Running, http: httpx.Client) -> None:
    chat = {"model": "fake-omni", "messages": [{"role": "user", "content": "x"}]}
    before = http.get("/load").json()["active_sessions"]
    for key in ("s-one", "s-two", "s-one"):
        assert http.post(
            "/v1/chat/completions", json=chat, headers={"x-session-id": key}
        ).is_success
    load = http.get("/load").json()
    assert load["active_sessions"] == before + 2
    assert load["ttft_ms"] is not None and load["ttft_ms"] > 0

    worker.call(worker.pipeline.hold.clear)
    capacity = worker.service.settings.capacity
    worker.service.settings.capacity = 1
    held = {"model": "fake-omni", "messages": [{"role": "user", "content": "HOLD"}]}
    try:
        with httpx.Client(base_url=worker.url, headers=http.headers, timeout=10) as other:
            thread = threading.Thread(target=other.post, args=("/v1/chat/completions",),
                                      kwargs={"json": held})  # fmt: skip
            thread.start()
            wait_for(lambda: worker.service.in_flight == 1)
            assert_error(http.post("/v1/chat/completions", json=chat), 503, "overloaded")
            worker.call(worker.pipeline.hold.set)
            thread.join(timeout=10)
    finally:
        worker.service.settings.capacity = capacity
        worker.call(worker.pipeline.hold.set)
    assert worker.service.in_flight == 0


def test_a_full_stage_is_refused_at_admission(worker: Running, http: httpx.Client) -> None:
    """Beyond a stage's running + queued requests (the pipeline's stage_limits), admission
    answers 503 overloaded naming the stage, before any byte of a stream; each choice of a
    chat counts, and a refused request takes no room."""
    chat = {"model": "fake-omni", "messages": [{"role": "user", "content": "x"}]}
    held = {"model": "fake-omni", "messages": [{"role": "user", "content": "HOLD"}]}
    worker.pipeline.limits = {"thinker": 2}
    worker.call(worker.pipeline.hold.clear)
    try:
        with httpx.Client(base_url=worker.url, headers=http.headers, timeout=10) as other:
            thread = threading.Thread(target=other.post, args=("/v1/chat/completions",),
                                      kwargs={"json": held})  # fmt: skip
            thread.start()
            wait_for(lambda: worker.service.waiting["thinker"] == 1)
            body = assert_error(
                http.post("/v1/chat/completions", json={**chat, "n": 2}), 503, "overloaded"
            )
            assert "stage thinker is full: 1 requests running or queued of 2" in str(body)
            streamed = http.post("/v1/chat/completions", json={**chat, "n": 2, "stream": True})
            assert_error(streamed, 503, "overloaded")
            assert http.post("/v1/chat/completions", json=chat).status_code == 200
            worker.call(worker.pipeline.hold.set)
            thread.join(timeout=10)
    finally:
        worker.pipeline.limits = {}
        worker.call(worker.pipeline.hold.set)
    assert worker.service.waiting["thinker"] == 0 and worker.service.in_flight == 0


def test_store_true_is_refused_not_ignored(http: httpx.Client) -> None:
    body = {"model": "fake-omni", "messages": [{"role": "user", "content": "hi"}], "store": True}
    assert_error(http.post("/v1/chat/completions", json=body), 400, "invalid_request")
    assert http.post("/v1/chat/completions", json={**body, "store": False}).status_code == 200


def test_voice_aliases_name_the_checkpoints_speakers(caplog: pytest.LogCaptureFixture) -> None:
    """The spec's ``voice_aliases`` are built-in voices too, each speaking as its speaker; one
    whose speaker the checkpoint lacks, or that is a speaker's own name, is left out, said."""
    import yaml

    from worker.service import builtin_voices

    spec = ModelSpec.model_validate(
        yaml.safe_load(Path("configs/models/tiny-qwen3-tts.yaml").read_text())
    ).model_copy(update={"voice_aliases": {"alloy": "vivian", "ash": "serena", "ryan": "vivian"}})
    with caplog.at_level("WARNING"):
        names = builtin_voices(spec, ["vivian", "ryan"])
    assert names == {"vivian": "vivian", "ryan": "ryan", "alloy": "vivian"}
    assert "'ash' -> 'serena' not served" in caplog.text
    assert "'ryan' -> 'vivian' not served: it is a speaker's own name" in caplog.text
