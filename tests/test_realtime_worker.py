"""/v1/realtime on one real worker process (tiny-omni, a private real Redis) through the
official ``openai`` SDK's realtime client: text in, text and audio out; audio in with server
VAD; barge-in and response.cancel freeing every stage; each bad input its error code with the
session going on; the session limit; a conversation stored in Redis and resumed by a second
connection; the drain closing sessions with 1012 (last: it stops the module's worker).
Router-level tests are tests/test_realtime_fleet.py."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import redis
from realtime_client import (
    add_user_text,
    audio_session,
    b64,
    read_response,
    silence_pcm,
    speech_pcm,
    stream_audio,
)
from websockets.exceptions import ConnectionClosed
from worker_procs import WorkerProcess

from fleet.keys import FleetKeys
from fleet.redis_server import RedisServer

pytestmark = pytest.mark.slow

MODEL = "tiny-omni"
TOKEN = "rt-token"
FLEET = "rt"
KEYS = FleetKeys(FLEET)
MAX_SESSIONS = 3
MAX_ITEMS = 8
MAX_BUFFER_S = 4


@pytest.fixture(scope="module")
def rt_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def worker(rt_redis: RedisServer, tmp_path_factory) -> Iterator[WorkerProcess]:
    w = WorkerProcess(
        "--fleet",
        FLEET,
        "--cache-dir",
        str(tmp_path_factory.mktemp("omni-cache")),
        "--drain-timeout",
        "30",
        redis_url=rt_redis.url,
        token=TOKEN,
        env={
            "OMNI_REALTIME_MAX_SESSIONS": str(MAX_SESSIONS),
            "OMNI_REALTIME_MAX_ITEMS": str(MAX_ITEMS),
            "OMNI_REALTIME_MAX_BUFFER_SECONDS": str(MAX_BUFFER_S),
        },
    )
    try:
        yield w.wait_ready()
    finally:
        w.stop()
        w.kill()


def client(worker: WorkerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=worker.url + "/v1", api_key=TOKEN, max_retries=0)


def connect(worker: WorkerProcess, **kwargs):
    return client(worker).realtime.connect(model=MODEL, **kwargs)


async def created(conn) -> str:
    event = await conn.recv()
    assert event.type == "session.created", event
    return event.session.id


async def opened(conn, **settings):
    """A new session set to audio out and manual turns; its session.updated event."""
    await created(conn)
    await conn.session.update(session=audio_session(vad=None, **settings))
    updated, _ = await next_of(conn, "session.updated")
    return updated


async def next_of(conn, kind: str, timeout: float = 30):
    """Events up to the first of type ``kind`` (returned) and the types seen before it."""
    seen: list[str] = []
    async with asyncio.timeout(timeout):
        while True:
            event = await conn.recv()
            if event.type == kind:
                return event, seen
            seen.append(event.type)


def load(worker: WorkerProcess) -> dict:
    return httpx.get(worker.url + "/load", headers=worker.headers, timeout=5).json()


def metric(worker: WorkerProcess, name: str) -> float:
    text = httpx.get(worker.url + "/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def idle(worker: WorkerProcess, timeout: float = 10) -> dict:
    """The worker's load once nothing is in flight in it or any stage."""
    deadline = time.monotonic() + timeout
    while True:
        report = load(worker)
        if report["in_flight"] == 0 and not any(report["queue_depth"].values()):
            return report
        assert time.monotonic() < deadline, f"work left in flight: {report}"
        await asyncio.sleep(0.1)


async def test_text_in_text_and_audio_out(worker: WorkerProcess) -> None:
    async with connect(worker) as conn:
        updated = await opened(conn, instructions="Be brief.")
        assert updated.session.id
        assert updated.session.instructions == "Be brief."
        assert updated.session.audio.input.turn_detection is None
        await add_user_text(conn, "Hello, who are you?")
        added, _ = await next_of(conn, "conversation.item.done")
        assert added.item.role == "user" and added.item.content[0].text.startswith("Hello")
        await conn.response.create()
        first = await read_response(conn)
        assert first.status in ("completed", "incomplete"), first.events
        assert first.transcript and first.audio_seconds > 0.1
        assert len(first.audio) % 2 == 0
        # the GA event sequence a voice client follows
        order = [
            "response.created",
            "response.output_item.added",
            "conversation.item.added",
            "response.content_part.added",
            "response.output_audio_transcript.done",
            "response.content_part.done",
            "response.output_item.done",
            "conversation.item.done",
            "response.done",
        ]
        positions = [first.events.index(kind) for kind in order]
        assert positions == sorted(positions), first.events
        assert first.output[0].content[0].transcript == first.transcript
        assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0

        # the client played half of the reply: the item keeps what that half said
        played_ms = int(first.audio_seconds * 500)
        reply_id = first.output[0].id
        await conn.conversation.item.truncate(
            item_id=reply_id, content_index=0, audio_end_ms=played_ms
        )
        truncated, _ = await next_of(conn, "conversation.item.truncated")
        assert (truncated.item_id, truncated.audio_end_ms) == (reply_id, played_ms)
        await conn.conversation.item.retrieve(item_id=reply_id)
        got, _ = await next_of(conn, "conversation.item.retrieved")
        kept = got.item.content[0].transcript
        assert first.transcript.startswith(kept)
        assert 0.3 * len(first.transcript) <= len(kept) <= 0.5 * len(first.transcript) + 1

        # text only for this one response; the history now holds both turns
        await add_user_text(conn, "And in one word?")
        await conn.response.create(response={"output_modalities": ["text"]})
        second = await read_response(conn)
        assert second.text and not second.audio and not second.transcript
        assert "response.output_text.done" in second.events
        assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens // 2


async def test_response_temperature_and_cached_tokens(worker: WorkerProcess) -> None:
    """``temperature`` (the beta API's session and response field) samples the reply, 0 is
    greedy; a turn after the first reports the prompt its worker's prefix cache served
    (``usage.input_token_details.cached_tokens``); out of range is an error naming it."""
    async with connect(worker) as conn:
        await opened(conn)
        ask = {"type": "message", "role": "user",
               "content": [{"type": "input_text", "text": "Tell me something new."}]}  # fmt: skip

        async def reply(**settings: object) -> str:
            await conn.response.create(response={
                "output_modalities": ["text"], "conversation": "none", "input": [ask],
                "max_output_tokens": 16, **settings,
            })  # fmt: skip
            return (await read_response(conn)).text

        greedy = await reply()
        assert greedy and await reply(temperature=0) == greedy
        sampled = {await reply(temperature=1.5) for _ in range(3)}
        assert sampled - {greedy}, "temperature changed nothing"
        await conn.send_raw(json.dumps({"type": "response.create",
                                        "response": {"temperature": 5}}))  # fmt: skip
        error, _ = await next_of(conn, "error")
        assert "temperature" in (error.error.param or error.error.message), error

        await add_user_text(conn, "Hello, who are you?")
        await conn.response.create(response={"output_modalities": ["text"]})
        first = await read_response(conn)
        await add_user_text(conn, "And then?")
        await conn.response.create(response={"output_modalities": ["text"]})
        second = await read_response(conn)
        cached = second.usage.input_token_details.cached_tokens
        assert first.usage.input_tokens - 2 <= cached < second.usage.input_tokens, second.usage


async def test_audio_in_with_server_vad(worker: WorkerProcess) -> None:
    async with connect(worker) as conn:
        await created(conn)
        vad = {"type": "server_vad", "silence_duration_ms": 300, "prefix_padding_ms": 100}
        settings = audio_session(vad=vad)
        # any model name: the served model transcribes
        settings["audio"]["input"]["transcription"] = {"model": "whisper-1"}
        await conn.session.update(session=settings)
        await next_of(conn, "session.updated")
        speech = 1.2
        # more silence than the buffer holds first: waiting for speech never fills it
        lead = MAX_BUFFER_S + 1.0
        audio = silence_pcm(lead) + speech_pcm(speech) + silence_pcm(0.6)
        await stream_audio(conn, audio, paced=False)
        started, seen = await next_of(conn, "input_audio_buffer.speech_started")
        assert "error" not in seen
        stopped, _ = await next_of(conn, "input_audio_buffer.speech_stopped")
        start_ms = lead * 1000  # the speech's start, less the padding
        assert start_ms - 200 <= started.audio_start_ms <= start_ms
        assert start_ms + 1050 <= stopped.audio_end_ms <= start_ms + 1350
        committed, _ = await next_of(conn, "input_audio_buffer.committed")
        assert committed.item_id == started.item_id == stopped.item_id
        item, _ = await next_of(conn, "conversation.item.done")
        assert item.item.role == "user" and item.item.content[0].type == "input_audio"
        # server VAD answers by itself; the turn is transcribed beside the answer
        transcribed = []

        async def keep_transcript(event, _response) -> None:
            # (the deltas that come before: tests/test_realtime_fleet.py checks them)
            kind = event.type
            if kind.startswith(
                "conversation.item.input_audio_transcription."
            ) and not kind.endswith(".delta"):
                transcribed.append(event)

        reply = await read_response(conn, keep_transcript)
        assert reply.status in ("completed", "incomplete") and reply.audio_seconds > 0
        assert reply.usage.input_tokens > 10  # the audio's tokens went in
        if not transcribed:
            event, _ = await next_of(conn, "conversation.item.input_audio_transcription.completed")
            transcribed.append(event)
        (done,) = transcribed
        assert done.type == "conversation.item.input_audio_transcription.completed"
        assert done.item_id == committed.item_id and done.usage.output_tokens > 0
        await conn.conversation.item.retrieve(item_id=committed.item_id)
        got, _ = await next_of(conn, "conversation.item.retrieved")
        assert got.item.content[0].transcript == done.transcript
        seconds = len(base64.b64decode(got.item.content[0].audio)) / 2 / 24_000
        assert speech <= seconds <= speech + 0.6


async def test_cancel_and_barge_in_free_every_stage(worker: WorkerProcess) -> None:
    aborted = metric(worker, "omni_worker_aborted_total")
    async with connect(worker) as conn:
        await opened(conn)
        await add_user_text(conn, "Tell me a long story.")
        await conn.response.create()

        async def cancel_on_audio(event, response) -> None:
            if event.type == "response.output_audio.delta" and len(response.audio) == 0:
                await conn.response.cancel()

        cut = await read_response(conn, cancel_on_audio)
        assert cut.status == "cancelled"
        done_item = cut.output[0]
        assert done_item.status == "incomplete"
        assert "response.output_audio.done" not in cut.events
        report = await idle(worker)
        assert report["active_sessions"] >= 1
        assert metric(worker, "omni_worker_aborted_total") >= aborted + 1
        # the conversation keeps the cut reply, no more than was sent of it
        await conn.conversation.item.retrieve(item_id=done_item.id)
        got, _ = await next_of(conn, "conversation.item.retrieved")
        assert got.item.status == "incomplete"
        assert len(got.item.content[0].transcript) <= len(cut.transcript)

        # barge-in: speech while a reply plays cancels it (turn_detected), then VAD answers
        vad = {"type": "server_vad", "silence_duration_ms": 300}
        await conn.session.update(session=audio_session(vad=vad))
        await next_of(conn, "session.updated")
        await add_user_text(conn, "Another story, please.")
        await conn.response.create()
        await next_of(conn, "response.output_item.added")
        await stream_audio(conn, speech_pcm(0.8) + silence_pcm(0.5), paced=False)
        done, seen = await next_of(conn, "response.done")
        assert "input_audio_buffer.speech_started" in seen
        assert done.response.status == "cancelled"
        assert done.response.status_details.reason == "turn_detected"
        answer = await read_response(conn)
        assert answer.status in ("completed", "incomplete")
    await idle(worker)


async def test_a_conversation_over_the_context_leaves_out_its_oldest_turns(
    worker: WorkerProcess,
) -> None:
    context = 2048  # tiny-omni's thinker; its tokenizer takes a token per byte
    async with connect(worker) as conn:
        await opened(conn)
        for word in ("alpha", "beta"):
            # ~1300 tokens each: the two overflow the context together
            await add_user_text(conn, (word + " ") * (context // 8))
            await next_of(conn, "conversation.item.done")
        await conn.response.create(response={"output_modalities": ["text"]})
        reply = await read_response(conn)
    assert reply.status in ("completed", "incomplete") and reply.text
    assert context // 2 < reply.usage.input_tokens < context


async def test_bad_inputs_get_error_codes_and_the_session_goes_on(worker: WorkerProcess) -> None:
    async with connect(worker) as conn:
        await opened(conn)

        async def refused(send, code: str, param: str | None = None) -> None:
            await send
            error, _ = await next_of(conn, "error")
            assert error.error.code == code, error
            if param is not None:
                assert error.error.param == param, error

        await refused(conn.send_raw("{not json"), "invalid_json")
        await refused(conn.send_raw('{"type": "no.such.event", "event_id": "e1"}'), "unknown_event")
        error_with_id = json.dumps(
            {"type": "input_audio_buffer.append", "audio": "@@@", "event_id": "e2"}
        )
        await conn.send_raw(error_with_id)
        error, _ = await next_of(conn, "error")
        assert (error.error.code, error.error.event_id) == ("invalid_audio", "e2")
        await refused(conn.input_audio_buffer.append(audio=b64(b"\x01\x02\x03")), "invalid_audio")
        await refused(
            conn.send_raw(
                json.dumps(
                    {
                        "type": "input_audio_buffer.append",
                        "audio": b64(b"x" * 2 * 24_000 * (MAX_BUFFER_S + 1)),
                    }
                )
            ),
            "input_audio_buffer_full",
        )
        await refused(conn.input_audio_buffer.commit(), "input_audio_buffer_commit_empty")
        # streamed text is for text-to-speech models: a chat model says so
        streamed = {"type": "input_text_buffer.append", "delta": "Hello"}
        await refused(conn.send_raw(json.dumps(streamed)), "invalid_request", "type")
        await refused(conn.send_raw('{"type": "input_text_buffer.commit"}'), "invalid_request")
        opus = {"type": "realtime", "audio": {"input": {"format": {"type": "audio/opus"}}}}
        await refused(
            conn.send_raw(json.dumps({"type": "session.update", "session": opus})),
            "unsupported_audio_format",
        )
        await refused(
            conn.send_raw(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {
                            "type": "realtime",
                            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}},
                        },
                    }
                )
            ),
            "unsupported_audio_format",
        )
        voice = {"type": "realtime", "audio": {"output": {"voice": "no-such-voice"}}}
        await refused(conn.session.update(session=voice), "voice_not_found")
        await refused(conn.response.cancel(), "response_cancel_not_active")
        await refused(
            conn.conversation.item.truncate(item_id="nope", content_index=0, audio_end_ms=10),
            "item_not_found",
        )
        # text no context holds is refused before tokenizing (tiny-omni's bound: 131072 bytes)
        await refused(add_user_text(conn, "x" * 140_000), "context_length_exceeded", "item.content")
        call = {"type": "function_call", "name": "f", "arguments": "{}"}
        await refused(conn.conversation.item.create(item=call), "invalid_request")
        await refused(
            conn.send_raw('{"type": "session.update", "session": {"output_modalities": []}}'),
            "invalid_request",
        )
        counted = metric(worker, 'omni_worker_realtime_errors_total{code="invalid_audio"}')
        assert counted >= 2  # the bad base64 and the torn sample
        # nothing was lost: the session still answers, with the settings it had; this time to
        # audio committed by hand
        await stream_audio(conn, speech_pcm(0.6), paced=False)
        await conn.input_audio_buffer.commit()
        committed, seen = await next_of(conn, "input_audio_buffer.committed")
        assert "error" not in seen and "input_audio_buffer.speech_started" not in seen
        item, _ = await next_of(conn, "conversation.item.done")
        assert item.item.id == committed.item_id and item.item.content[0].type == "input_audio"
        await conn.response.create()
        reply = await read_response(conn)
        assert reply.status in ("completed", "incomplete") and reply.audio


async def test_session_limit_refuses_with_a_close_code(worker: WorkerProcess) -> None:
    deadline = time.monotonic() + 5
    while metric(worker, "omni_worker_realtime_sessions") > 0:  # earlier tests' sessions
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    managers = [connect(worker) for _ in range(MAX_SESSIONS)]
    conns = []
    try:
        for manager in managers:
            conn = await manager.enter()
            conns.append(conn)
            await created(conn)
        assert metric(worker, "omni_worker_realtime_sessions") == MAX_SESSIONS
        assert load(worker)["active_sessions"] >= MAX_SESSIONS
        async with connect(worker) as extra:
            event = await extra.recv()
            assert event.type == "error" and event.error.code == "too_many_sessions"
            with pytest.raises(ConnectionClosed) as closed:
                await extra.recv()
            assert closed.value.rcvd.code == 1013
        assert metric(worker, 'omni_worker_realtime_closes_total{code="1013"}') == 1
        # a place frees up: the next one is served
        await conns.pop().close()
        async with connect(worker) as again:
            await created(again)
    finally:
        for conn in conns:
            await conn.close()


async def test_wrong_token_and_model_are_refused(worker: WorkerProcess) -> None:
    bad = openai.AsyncOpenAI(base_url=worker.url + "/v1", api_key="wrong", max_retries=0)
    for manager, code in (
        (bad.realtime.connect(model=MODEL), "invalid_api_key"),
        (client(worker).realtime.connect(model="gpt-realtime"), "model_not_found"),
    ):
        async with manager as conn:
            event = await conn.recv()
            assert event.type == "error" and event.error.code == code
            with pytest.raises(ConnectionClosed) as closed:
                await conn.recv()
            assert closed.value.rcvd.code == 1008


async def test_conversation_resumes_from_redis(worker: WorkerProcess, rt_redis) -> None:
    session_id = f"resume-{time.monotonic_ns()}"
    headers = {"x-session-id": session_id}
    async with connect(worker, extra_headers=headers) as conn:
        updated = await opened(conn, instructions="Remember me.")
        assert updated.session.id == session_id
        await add_user_text(conn, "My name is Ada.")
        first_item, _ = await next_of(conn, "conversation.item.done")
        await conn.response.create()
        first = await read_response(conn)
    r = redis.Redis.from_url(rt_redis.url)
    stored = [json.loads(raw) for raw in r.lrange(KEYS.conversation(session_id), 0, -1)]
    assert [i["role"] for i in stored] == ["user", "assistant"]
    assert stored[1]["content"][0]["transcript"] == first.transcript
    assert 0 < r.pttl(KEYS.conversation(session_id)) <= 3600 * 1000

    # a new connection with the same id (here as the query parameter) resumes it
    async with connect(worker, extra_query={"session_id": session_id}) as conn:
        event = await conn.recv()
        assert event.session.id == session_id
        assert event.session.instructions == "Remember me."
        await conn.conversation.item.retrieve(item_id=first_item.item.id)
        got, _ = await next_of(conn, "conversation.item.retrieved")
        assert got.item.content[0].text == "My name is Ada."
        await add_user_text(conn, "What is my name?")
        await conn.response.create()
        second = await read_response(conn)
        # the whole history went in: more than the first turn's prompt and reply together
        assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens // 2
        # a deleted item leaves the stored conversation too
        stored_before = r.llen(KEYS.conversation(session_id))
        await conn.conversation.item.delete(item_id=first_item.item.id)
        deleted, _ = await next_of(conn, "conversation.item.deleted")
        assert deleted.item_id == first_item.item.id
        assert r.llen(KEYS.conversation(session_id)) == stored_before - 1
        # bounded: past MAX_ITEMS the oldest items drop off, in Redis too
        for i in range(MAX_ITEMS):
            await add_user_text(conn, f"filler {i}")
            await next_of(conn, "conversation.item.done")
    assert r.llen(KEYS.conversation(session_id)) == MAX_ITEMS


async def test_beta_protocol_names(worker: WorkerProcess) -> None:
    """``client.beta.realtime`` (``OpenAI-Beta: realtime=v1``) gets the beta event names."""
    ws_url = worker.url.replace("http://", "ws://") + "/v1"
    beta = openai.AsyncOpenAI(
        base_url=worker.url + "/v1", websocket_base_url=ws_url, api_key=TOKEN, max_retries=0
    )
    async with beta.beta.realtime.connect(model=MODEL) as conn:
        event = await conn.recv()
        assert event.session.modalities == ["text", "audio"]
        assert event.session.input_audio_format == "pcm16"
        # (greedy, as audio_session() sets it: a sampled talker may end its speech at once)
        await conn.session.update(
            session={"turn_detection": None, "instructions": "Hi.", "temperature": 0}
        )
        await next_of(conn, "session.updated")
        await add_user_text(conn, "Hello")
        await conn.response.create()
        done, seen = await next_of(conn, "response.done")
    beta_names = {
        "conversation.item.created",
        "response.audio.delta",
        "response.audio_transcript.delta",
        "response.audio_transcript.done",
    }
    assert beta_names <= set(seen)
    assert not {"conversation.item.done", "response.output_audio.delta"} & set(seen)
    assert done.response.output[0].content[0].type == "audio"


async def test_drain_finishes_the_reply_then_closes_with_1012(worker: WorkerProcess) -> None:
    """Last: SIGTERM stops the module's worker."""
    async with connect(worker) as conn:
        await opened(conn)
        await add_user_text(conn, "One more answer.")
        await conn.response.create()
        await next_of(conn, "response.output_audio_transcript.delta")
        worker.proc.terminate()
        deadline = time.monotonic() + 5
        while httpx.get(worker.url + "/ready", timeout=5).status_code == 200:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        async with connect(worker) as late:  # new sessions are refused while draining
            event = await late.recv()
            assert event.type == "error" and event.error.code == "draining"
            with pytest.raises(ConnectionClosed) as refused:
                await late.recv()
            assert refused.value.rcvd.code == 1012
        done, _ = await next_of(conn, "response.done")
        assert done.response.status in ("completed", "incomplete")  # not cut by the drain
        error, _ = await next_of(conn, "error")
        assert error.error.code == "draining"
        with pytest.raises(ConnectionClosed) as closed:
            await conn.recv()
        assert closed.value.rcvd.code == 1012
    assert worker.wait_exit(30) == 0
