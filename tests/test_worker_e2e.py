"""omni-worker end to end: real worker processes running tiny-omni, a private real Redis,
the official openai SDK. Two workers are started for the whole module (A and B); the last
tests kill a stage process, restart Redis, SIGTERM-drain B and SIGKILL A."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import redis
import soundfile as sf
from worker_procs import WorkerProcess

from fleet.keys import FleetKeys
from fleet.redis_server import RedisServer

pytestmark = pytest.mark.slow

MODEL = "tiny-omni"
TOKEN = "e2e-token"
FLEET = "e2e"
KEYS = FleetKeys(FLEET)
COMMON = (
    "--fleet",
    FLEET,
    "--heartbeat-interval",
    "0.5",
    "--heartbeat-ttl",
    "2",
    "--load-interval",
    "0.25",
    "--max-audio-seconds",
    "20",
    # A spec override through the CLI (the spec's own value, so behaviour is unchanged).
    "--thinker.engine.max_running_requests",
    "16",
)


def wav_bytes(seconds: float, rate: int = 16_000, freq: float = 330.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not reached in {timeout}s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def fleet_redis() -> Iterator[RedisServer]:
    """This module's own Redis: the restart test stops and starts it."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def events(fleet_redis: RedisServer) -> Iterator[list[dict]]:
    """Every fleet event published while the module runs, in order."""
    seen: list[dict] = []
    client = redis.Redis.from_url(fleet_redis.url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(KEYS.events)
    stop = threading.Event()

    def pump() -> None:
        while not stop.is_set():
            try:
                message = pubsub.get_message(timeout=0.2)
            except (redis.ConnectionError, OSError):
                time.sleep(0.2)  # Redis restart test; resubscribe
                with contextlib.suppress(redis.ConnectionError, OSError):
                    pubsub.subscribe(KEYS.events)
                continue
            if message:
                seen.append(json.loads(message["data"]))

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    yield seen
    stop.set()
    thread.join(timeout=5)


@pytest.fixture(scope="module")
def workers(
    fleet_redis: RedisServer, events: list[dict], tmp_path_factory
) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    cache = str(tmp_path_factory.mktemp("omni-cache"))
    a = WorkerProcess(
        *COMMON, "--cache-dir", cache, redis_url=fleet_redis.url, worker_id="A", token=TOKEN
    )
    b = None
    try:
        # B starts once A has built the seeded checkpoint in the shared cache, and loads it
        wait_for(lambda: a.proc.poll() is not None or "launching" in a.log(), 120, "A's checkpoint")
        b = WorkerProcess(
            *COMMON,
            "--cache-dir",
            cache,
            "--drain-timeout",
            "60",
            redis_url=fleet_redis.url,
            worker_id="B",
            token=TOKEN,
        )
        a.wait_ready()
        b.wait_ready()
        yield a, b
    finally:
        for w in (a, b):
            if w is not None:
                w.kill()


@pytest.fixture
def sdk_a(workers) -> openai.OpenAI:
    return openai.OpenAI(base_url=workers[0].url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)


@pytest.fixture
def sdk_b(workers) -> openai.OpenAI:
    return openai.OpenAI(base_url=workers[1].url + "/v1", api_key=TOKEN, max_retries=0, timeout=60)


def builtin_voice(w: WorkerProcess) -> str:
    voices = httpx.get(w.url + "/v1/audio/voices", headers=w.headers, timeout=10).json()["data"]
    return next(v["name"] for v in voices if v["builtin"])


def load_of(w: WorkerProcess) -> dict:
    return httpx.get(w.url + "/load", headers=w.headers, timeout=10).json()


def test_registered_ready_with_plan_and_load(workers, fleet_redis, events) -> None:
    a, _ = workers
    client = redis.Redis.from_url(fleet_redis.url)
    record = json.loads(client.get(KEYS.worker("A")))
    assert record["status"] == "ready" and record["url"] == a.url
    assert record["served_models"] == [MODEL]
    assert set(record["capabilities"]["endpoints"]) >= {"chat", "speech", "transcription"}
    # the plan is stored once under its digest, out of the record that routers resync
    assert "plan" not in record and len(record["plan_digest"]) == 16
    plan = json.loads(client.get(KEYS.plan(record["plan_digest"])))
    assert plan["spec"] == MODEL and plan["fits"]
    assert client.sismember(KEYS.workers, "A")
    assert 0 < client.pttl(KEYS.worker("A")) <= 2000
    # the load report is refreshed several times a second
    first = json.loads(client.get(KEYS.load("A")))["at"]
    wait_for(lambda: json.loads(client.get(KEYS.load("A")))["at"] > first, 1.0, "a new report")
    load = json.loads(client.get(KEYS.load("A")))
    assert set(load["queue_depth"]) and load["in_flight"] == 0 and load["healthy"]
    # each stage process's measured peak beside what the plan gave it (host memory on the CPU)
    planned = {p["name"] for p in plan["nodes"][0]["processes"]}
    assert set(load["memory"]) == planned
    for name, mem in load["memory"].items():
        assert mem["device"] == "cpu" and mem["limit_fraction"] is None, name
        assert mem["planned_bytes"] > 0 and mem["peak_bytes"] > 10 * 2**20, (name, mem)
    assert "chelsie" in record["voices"]  # the built-in voices, for the routers' /v1/models
    # what chat's response_format and tools check with was imported during start-up: on the
    # first request it held the API's event loop for seconds, and the record expired
    assert "libxgrammar_bindings" in Path(f"/proc/{a.pid}/maps").read_text()
    # joined (as starting) before ready, for both workers
    kinds = [e["kind"] for e in events if e["worker_id"] == "A"]
    assert kinds[:2] == ["joined", "ready"], kinds
    assert "ready" in [e["kind"] for e in events if e["worker_id"] == "B"]


def test_chat_plain_and_streamed(sdk_a: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Tell me about omni models."}]
    out = sdk_a.chat.completions.create(model=MODEL, messages=messages, max_tokens=12)
    text = out.choices[0].message.content
    assert isinstance(text, str) and text
    assert out.usage is not None and 0 < out.usage.completion_tokens <= 12
    stream = sdk_a.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, stream=True
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    deltas = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(deltas) > 1, "text should arrive as several deltas"
    assert "".join(deltas) == text  # greedy decoding: streamed == whole
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_chat_audio_output_whole_and_streamed(workers, sdk_a: openai.OpenAI) -> None:
    voice = builtin_voice(workers[0])
    kwargs = dict(
        model=MODEL,
        modalities=["text", "audio"],
        max_tokens=8,
        messages=[{"role": "user", "content": "Say something."}],
        seed=4,  # (the talker samples: one seed, the same speech)
    )
    out = sdk_a.chat.completions.create(audio={"voice": voice, "format": "wav"}, **kwargs)
    message = out.choices[0].message
    assert message.audio is not None and message.audio.transcript == message.content
    wav = base64.b64decode(message.audio.data)
    pcm, rate = sf.read(io.BytesIO(wav), dtype="int16")
    assert rate == 24_000 and pcm.size > 0
    stream = sdk_a.chat.completions.create(
        audio={"voice": voice, "format": "pcm16"}, stream=True, **kwargs
    )
    audio_chunks: list[bytes] = []
    text: list[str] = []
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text.append(delta.content or "")
        if delta.audio is not None and delta.audio.data:
            audio_chunks.append(base64.b64decode(delta.audio.data))
    assert len(audio_chunks) > 1, "audio should stream in several chunks"
    assert b"".join(audio_chunks) == wav[44:]
    assert "".join(text) == message.content


def test_speech_whole_and_streamed(workers, sdk_a: openai.OpenAI) -> None:
    voice = builtin_voice(workers[0])
    seeded = {"seed": 4}  # (the talker samples: one seed, the same speech)
    whole = sdk_a.audio.speech.create(
        model=MODEL,
        input="Hello from the fleet.",
        voice=voice,
        response_format="wav",
        extra_body=seeded,
    ).content
    assert whole[:4] == b"RIFF" and len(whole) > 44
    pieces: list[bytes] = []
    with sdk_a.audio.speech.with_streaming_response.create(
        model=MODEL,
        input="Hello from the fleet.",
        voice=voice,
        response_format="pcm",
        stream_format="audio",
        extra_body=seeded,
    ) as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        pieces = list(response.iter_bytes(chunk_size=None))
    assert b"".join(pieces) == whole[44:]


def test_transcription(sdk_a: openai.OpenAI) -> None:
    out = sdk_a.audio.transcriptions.create(
        model=MODEL, file=("clip.wav", wav_bytes(1.5), "audio/wav")
    )
    assert isinstance(out.text, str)
    again = sdk_a.audio.transcriptions.create(
        model=MODEL, file=("clip.wav", wav_bytes(1.5), "audio/wav")
    )
    assert again.text == out.text


def test_uploaded_voices_refused_where_the_model_cannot_clone(
    workers, sdk_b: openai.OpenAI
) -> None:
    """Qwen3-Omni speaks only its built-in speakers: its workers do not advertise voices, refuse
    uploads with a clear 404, and name the voices they have (cloning is Qwen3-TTS Base's)."""
    a, _ = workers
    up = httpx.post(
        a.url + "/v1/audio/voices",
        headers=a.headers,
        timeout=30,
        data={"name": "narrator"},
        files={"file": ("n.wav", wav_bytes(1.0, freq=220))},
    )
    assert up.status_code == 404 and "takes no uploaded voices" in up.json()["error"]["message"]
    models = httpx.get(a.url + "/v1/models", headers=a.headers, timeout=10).json()["data"]
    assert all("voices" not in m.get("capabilities", {}).get("endpoints", []) for m in models)
    with pytest.raises(openai.BadRequestError) as err:
        sdk_b.audio.speech.create(model=MODEL, input="x", voice="nobody")
    assert err.value.body["code"] == "voice_not_found"
    assert "ethan" in err.value.body["message"]


def test_determinism_across_workers(workers, sdk_a: openai.OpenAI, sdk_b: openai.OpenAI) -> None:
    """A seeded speech request (the talker samples) is the same bytes on another worker, and
    another seed is other audio; greedy chat is the same text."""
    voice = builtin_voice(workers[0])
    request = dict(model=MODEL, input="Same bytes everywhere.", voice=voice, response_format="wav")

    def speak(sdk: openai.OpenAI, seed: int) -> bytes:
        return sdk.audio.speech.create(**request, extra_body={"seed": seed}).content  # type: ignore[call-overload]

    assert speak(sdk_a, 1) == speak(sdk_b, 1) != speak(sdk_b, 2)
    chat = dict(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Determinism?"}])
    assert (
        sdk_a.chat.completions.create(**chat).choices[0].message.content
        == sdk_b.chat.completions.create(**chat).choices[0].message.content
    )


def test_abort_on_disconnect(workers) -> None:
    a, _ = workers
    voice = builtin_voice(a)

    async def cut_after_first_chunk() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            body = {
                "model": MODEL,
                "input": "A long sentence to speak " * 6,
                "voice": voice,
                "response_format": "pcm",
                "stream": True,
            }
            async with client.stream(
                "POST", a.url + "/v1/audio/speech", json=body, headers=a.headers
            ) as response:
                assert response.status_code == 200
                async for _ in response.aiter_bytes():
                    break  # first audio chunk, then hang up

    def settled() -> bool:
        load = load_of(a)
        return load["in_flight"] == 0 and not any(load["queue_depth"].values())

    def aborted() -> float:
        metrics = httpx.get(a.url + "/metrics", timeout=10).text
        line = next(x for x in metrics.splitlines() if x.startswith("omni_worker_aborted_total "))
        return float(line.split()[1])

    # The whole reply is 64 talker frames, a fraction of a second: on two busy cores the worker
    # may have sent all of it before it reads the hang-up, and then there is nothing to abort
    # (seen once in a full run). Each round is a fresh request; one of three must be aborted.
    before, counts = aborted(), []
    for _ in range(3):
        asyncio.run(cut_after_first_chunk())
        wait_for(settled, 15, "in-flight and every stage queue back to 0")
        counts.append(aborted())
        if counts[-1] > before:
            break
    assert counts[-1] == before + 1, (before, counts)


def test_bad_inputs_on_the_real_worker(workers, sdk_a: openai.OpenAI) -> None:
    a, _ = workers
    with pytest.raises(openai.NotFoundError) as err:
        sdk_a.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert err.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as err:
        sdk_a.audio.transcriptions.create(model=MODEL, file=("x.wav", b"RIFFjunk", "audio/wav"))
    assert err.value.body["code"] == "invalid_audio"
    with pytest.raises(openai.BadRequestError) as err:
        sdk_a.audio.transcriptions.create(model=MODEL, file=("x.wav", wav_bytes(25.0), "audio/wav"))
    assert err.value.body["code"] == "audio_too_long"
    r = httpx.post(
        a.url + "/v1/chat/completions",
        headers={**a.headers, "content-type": "application/json"},
        content=b'{"model": ',
        timeout=10,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(
        a.url + "/v1/chat/completions",
        headers=a.headers,
        timeout=10,
        json={"model": MODEL, "messages": [{"role": "user", "content": 5}]},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request"
    # a prompt over the thinker's context length is refused where its tokens are counted, with
    # OpenAI's code for it: the client's error
    with pytest.raises(openai.BadRequestError) as err:
        sdk_a.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "word " * 3000}]
        )
    assert err.value.body["code"] == "context_length_exceeded"
    assert "context length" in err.value.body["message"]
    # unauthenticated
    r = httpx.get(a.url + "/v1/models", timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(a.url + "/health", timeout=10).status_code == 200
    # still serving
    assert sdk_a.models.list().data[0].id == MODEL


def test_stage_process_killed_and_recovered(workers, sdk_a: openai.OpenAI, events) -> None:
    a, _ = workers
    processes = httpx.get(a.url + "/health", timeout=5).json()["processes"]
    victim = next(pid for name, pid in processes.items() if name.endswith("/talker"))
    assert victim in a.children()  # a child of the worker, as the /proc scan sees it
    voice = builtin_voice(a)
    stream = sdk_a.chat.completions.create(
        model=MODEL,
        modalities=["text", "audio"],
        audio={"voice": voice, "format": "pcm16"},
        max_tokens=64,
        stream=True,
        messages=[{"role": "user", "content": "Talk for a while."}],
        seed=0,  # the talker samples; a tiny random one may end at its first frame
    )
    with pytest.raises(openai.APIError) as err:
        for chunk in stream:
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is not None and delta.audio is not None and delta.audio.data and victim:
                os.kill(victim, signal.SIGKILL)  # mid-stream: the talker group dies
                victim = 0
    assert victim == 0, "the stream ended before any audio arrived"
    assert err.value.code == "stage_failed", err.value.body
    wait_for(
        lambda: (
            [e["kind"] for e in events if e["worker_id"] == "A"][-1:] == ["ready"]
            and "unhealthy" in [e["kind"] for e in events if e["worker_id"] == "A"]
        ),
        120,
        f"unhealthy, then ready again; events {events}\n{a.log()}",
    )
    assert httpx.get(a.url + "/ready", timeout=5).status_code == 200
    out = sdk_a.chat.completions.create(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "back?"}]
    )
    assert out.choices[0].message.content
    speech = sdk_a.audio.speech.create(
        model=MODEL, input="Recovered.", voice=voice, extra_body={"seed": 0}
    )
    assert len(speech.content) > 44


def test_redis_restart_reregisters(workers, fleet_redis: RedisServer, sdk_a) -> None:
    client = redis.Redis.from_url(fleet_redis.url)
    fleet_redis.stop()
    try:
        # Redis down: the worker keeps serving
        out = sdk_a.chat.completions.create(
            model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "still?"}]
        )
        assert out.choices[0].message.content
        assert httpx.get(workers[0].url + "/ready", timeout=5).status_code == 200
        wait_for(
            lambda: "omni_worker_redis_up 0.0" in httpx.get(workers[0].url + "/metrics").text,
            10,
            "redis_up gauge at 0",
        )
    finally:
        fleet_redis.start()  # same port, empty: nothing was persisted
    for worker_id in ("A", "B"):
        raw = wait_for(lambda w=worker_id: client.get(KEYS.worker(w)), 15, f"{worker_id} back")
        assert json.loads(raw)["status"] == "ready"
        assert client.sismember(KEYS.workers, worker_id)
        wait_for(lambda w=worker_id: client.get(KEYS.load(w)), 5, f"{worker_id} load back")


def test_sigterm_drains_without_losing_in_flight(workers, fleet_redis, events) -> None:
    _, b = workers
    client = redis.Redis.from_url(fleet_redis.url)
    voice = builtin_voice(b)
    body = {
        "model": MODEL,
        "input": "Finish this sentence before you go. " * 3,
        "voice": voice,
        "response_format": "pcm",
        "stream": True,
        "seed": 9,  # (the talker samples: the reference and the drained stream alike)
    }
    reference = httpx.post(
        b.url + "/v1/audio/speech", headers=b.headers, timeout=120, json={**body, "stream": False}
    ).content
    got: list[bytes] = []

    def stream() -> None:
        with httpx.stream(
            "POST", b.url + "/v1/audio/speech", json=body, headers=b.headers, timeout=120
        ) as response:
            assert response.status_code == 200
            got.extend(response.iter_bytes())

    thread = threading.Thread(target=stream)
    thread.start()
    wait_for(lambda: got, 60, "first audio of the in-flight request")
    b.proc.send_signal(signal.SIGTERM)
    # draining at once: /ready and new requests answer 503 draining, the record says so
    wait_for(
        lambda: json.loads(client.get(KEYS.worker("B")) or b"{}").get("status") == "draining",
        5,
        "record draining",
    )
    ready = httpx.get(b.url + "/ready", timeout=5)
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "draining"
    refused = httpx.post(
        b.url + "/v1/audio/speech", headers=b.headers, timeout=10, json={**body, "stream": False}
    )
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
    thread.join(timeout=120)
    assert b"".join(got) == reference  # the in-flight request finished, every byte
    assert b.wait_exit(60) == 0
    assert client.get(KEYS.worker("B")) is None and not client.sismember(KEYS.workers, "B")
    kinds = [e["kind"] for e in events if e["worker_id"] == "B"]
    assert kinds[-2:] == ["draining", "left"], kinds


def test_killed_worker_expires_with_its_ttl(workers, fleet_redis) -> None:
    a, _ = workers
    client = redis.Redis.from_url(fleet_redis.url)
    assert client.get(KEYS.worker("A")) is not None
    a.kill()
    killed = time.monotonic()
    wait_for(
        lambda: client.get(KEYS.worker("A")) is None and client.get(KEYS.load("A")) is None,
        5,
        "record and load expired",
    )
    assert time.monotonic() - killed <= 2.5  # --heartbeat-ttl 2 (plus polling slack)


def test_refuses_to_start_when_the_plan_does_not_fit(tmp_path) -> None:
    w = WorkerProcess("--gpus", "cpu", "--thinker.device", "gpu", "--cache-dir", str(tmp_path))
    code = w.wait_exit(120)
    assert code == 3, w.log()
    assert "does not fit" in w.log()
    w.stop()


def test_refuses_to_start_when_torch_cannot_use_the_planned_gpus(tmp_path) -> None:
    """A worker planned for an H100 on this CPU host (its torch a CPU build) says so before any
    stage starts, naming the lock a GPU host installs."""
    w = WorkerProcess("--gpus", "1xH100-80GB", "--cache-dir", str(tmp_path))
    code = w.wait_exit(120)
    log = w.log(400)
    assert code == 4, log
    assert "the plan places stages on 1 GPU(s), but torch" in log
    assert "is a CPU build" in log and "deploy/gpu/uv.lock" in log
    assert "launching" not in log  # (no stage process was started)
    w.stop()
