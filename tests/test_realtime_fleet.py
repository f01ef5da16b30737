"""Realtime voice sessions end to end: the official ``openai`` SDK's realtime client through a
real omni-router to real tiny-omni workers of the live fleet (Redis, three workers, two
routers, API keys). Text in -> text and audio out; audio in with server VAD; two turns;
a cancelled response whose stages are freed; a worker killed mid-response and the SDK's own
reconnect (same session id) resuming the conversation on another worker, which runs the cut
response again, whole; a draining worker
finishing its response, then closing with 1012."""

from __future__ import annotations

import asyncio
import re
import signal
import uuid

import httpx
import openai
import orjson
import pytest

from tests.realtime_client import (
    add_user_text,
    audio_session,
    read_response,
    sdk_client,
    silence_pcm,
    speech_pcm,
    stream_audio,
)
from tests.reliability.fleet import KEYS, MODEL, Fleet, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SESSION_HEADER = "x-session-id"
# a response that ran to its end: "incomplete" when it stopped at max_output_tokens
FINISHED = ("completed", "incomplete")


def new_session_id() -> str:
    return f"rt-{uuid.uuid4().hex[:12]}"


def connect(fleet: Fleet, session_id: str, router: int = 0, **kw):
    """The SDK's connection manager for a session, through router ``router``."""
    client = sdk_client(fleet.routers[router].url, fleet.api_key)
    return client.realtime.connect(model=MODEL, extra_headers={SESSION_HEADER: session_id}, **kw)


def bound_worker(fleet: Fleet, session_id: str) -> str:
    """The worker the routers pinned the session to (its affinity binding in Redis)."""
    r = fleet.redis_client()
    try:
        value = r.get(KEYS.affinity(session_id))
    finally:
        r.close()
    assert value, f"session {session_id} is not bound"
    return value.decode()


async def say(conn, text: str, **response) -> object:
    """A user text item, then a response; the response as the client saw it."""
    await add_user_text(conn, text)
    await conn.response.create(response=response or None)
    return await read_response(conn)


async def opened(conn) -> None:
    event = await conn.recv()
    assert event.type == "session.created", event


def worker_metric(fleet: Fleet, worker_id: str, name: str) -> dict[str, float]:
    """label text -> value of one metric family on a worker's /metrics."""
    w = fleet.workers[worker_id]
    text = httpx.get(w.url + "/metrics", headers=w.headers, timeout=5).text
    out = {}
    for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


def test_text_in_text_and_audio_out(omni_fleet: Fleet) -> None:
    async def run() -> None:
        sid = new_session_id()
        async with connect(omni_fleet, sid) as conn:
            await opened(conn)
            await conn.session.update(session=audio_session(max_output_tokens=12))
            assert (await conn.recv()).type == "session.updated"
            r = await say(conn, "Hello, who are you?")
            assert r.status in FINISHED, r.events
            assert r.transcript and len(r.audio) > 0 and len(r.audio) % 2 == 0
            assert r.usage.output_tokens and r.usage.input_tokens
            for kind in ("response.created", "response.output_audio_transcript.done"):
                assert kind in r.events
            # text only: text deltas, no audio
            r = await say(conn, "And in text?", output_modalities=["text"])
            assert r.status in FINISHED and r.text and not r.audio
        assert bound_worker(omni_fleet, sid) in omni_fleet.workers

    asyncio.run(run())


def test_seed_and_top_p_are_honoured_and_unserved_fields_refused(omni_fleet: Fleet) -> None:
    """A response's (or the session's) seed gives the same draw again, a tiny top_p keeps the
    likeliest token (the greedy reply); OpenAI's fields this server does not serve (tracing,
    speed) are error events naming them, at their neutral values they pass, and an unknown
    field is refused, not dropped. The session goes on after each."""
    ask = {"type": "message", "role": "user",
           "content": [{"type": "input_text", "text": "Tell me something new."}]}  # fmt: skip

    async def run() -> None:
        async with connect(omni_fleet, new_session_id()) as conn:
            await opened(conn)

            async def reply(**settings: object) -> str:
                await conn.response.create(response={
                    "output_modalities": ["text"], "conversation": "none", "input": [ask],
                    "max_output_tokens": 12, **settings,
                })  # fmt: skip
                return (await read_response(conn)).text

            async def update(session: dict) -> object:
                await conn.send_raw(orjson.dumps(
                    {"type": "session.update", "session": {"type": "realtime", **session}}
                ).decode())  # fmt: skip
                return await conn.recv()

            greedy = await reply()
            seed, drawn = None, greedy
            for s in range(1, 9):
                drawn = await reply(temperature=1.0, seed=s)
                if drawn != greedy:
                    seed = s
                    break
            assert seed is not None, "no seed drew another reply than the greedy one"
            assert await reply(temperature=1.0, seed=seed) == drawn
            assert await reply(temperature=1.0, seed=seed, top_p=1e-6) == greedy
            updated = await update({"temperature": 1.0, "seed": seed})
            assert updated.type == "session.updated", updated
            assert await reply() == drawn  # the session's seed
            neutral = await update({"tools": [], "tool_choice": "auto", "tracing": None})
            assert neutral.type == "session.updated", neutral
            for session, param in (
                ({"tracing": "auto"}, "session.tracing"),
                ({"audio": {"output": {"speed": 1.25}}}, "session.audio.output.speed"),
                ({"modality": ["text"]}, "session.modality"),
            ):
                error = await update(session)
                assert error.type == "error", error
                assert error.error.param == param, error
            assert await reply() == drawn  # the session goes on, its settings unchanged

    asyncio.run(run())


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def test_function_calling(omni_fleet: Fleet) -> None:
    """The GA protocol's function calling through the router: a forced call (tool_choice
    required: held to the schema by the grammar) is the response's one ``function_call`` item,
    its arguments in ``response.function_call_arguments.delta`` / ``.done``; the client's
    ``function_call_output`` item continues the conversation, and the next reply reads the call
    and its output (its prompt grows by both). Audio output with tools is refused, naming it."""

    async def run() -> None:
        async with connect(omni_fleet, new_session_id()) as conn:
            await opened(conn)
            await conn.session.update(
                session={"type": "realtime", "output_modalities": ["text"], "tools": [WEATHER],
                         "tool_choice": "required", "max_output_tokens": 128}
            )  # fmt: skip
            updated = await conn.recv()
            assert updated.type == "session.updated", updated
            assert updated.session.tools[0].name == "get_weather"
            await add_user_text(conn, "What is the weather in Oslo?")
            await conn.response.create()
            called = await read_response(conn)
            assert called.status == "completed", called.events
            (item,) = called.output
            assert item.type == "function_call" and item.name == "get_weather", item
            arguments = orjson.loads(item.arguments)
            assert set(arguments) == {"city"} and isinstance(arguments["city"], str)
            assert called.events.index("response.function_call_arguments.delta") < (
                called.events.index("response.function_call_arguments.done")
            )
            assert "response.output_text.delta" not in called.events
            await conn.conversation.item.create(
                item={"type": "function_call_output", "call_id": item.call_id,
                      "output": '{"celsius": 21}'}
            )  # fmt: skip
            added = await conn.recv()
            assert added.type == "conversation.item.added", added
            assert added.item.type == "function_call_output"
            answered = await read_response_of(conn, {"tool_choice": "none"})
            assert answered.status in FINISHED and answered.output[0].type == "message"
            assert answered.usage.input_tokens > called.usage.input_tokens + 10
            await conn.send_raw(orjson.dumps({"type": "response.create", "response": {
                "output_modalities": ["audio"], "tool_choice": "auto"}}).decode())  # fmt: skip
            error = await conn.recv()
            assert error.type == "error", error
            assert error.error.param == "response.output_modalities", error

    asyncio.run(run())


async def read_response_of(conn, response: dict):
    await conn.response.create(response=response)
    return await read_response(conn)


def test_audio_in_with_server_vad(omni_fleet: Fleet) -> None:
    async def run() -> None:
        async with connect(omni_fleet, new_session_id()) as conn:
            await opened(conn)
            vad = {"type": "server_vad", "silence_duration_ms": 300, "prefix_padding_ms": 200}
            await conn.session.update(session=audio_session(vad=vad, max_output_tokens=8))
            await stream_audio(conn, silence_pcm(0.4) + speech_pcm(1.0), paced=False)
            # the trailing silence ends the turn: the server commits and answers by itself
            await stream_audio(conn, silence_pcm(0.6), paced=False)
            r = await read_response(conn)
            seen = r.events
            order = [
                "input_audio_buffer.speech_started",
                "input_audio_buffer.speech_stopped",
                "input_audio_buffer.committed",
                "response.created",
            ]
            assert [seen.index(k) for k in order] == sorted(seen.index(k) for k in order), seen
            assert r.status in FINISHED and len(r.audio) > 0

    asyncio.run(run())


def test_input_transcription_reads_its_language_and_prompt(omni_fleet: Fleet) -> None:
    """``audio.input.transcription``'s ``language`` hint and ``prompt`` reach the model as
    ``/v1/audio/transcriptions``'s do: each committed clip's transcription prompt grows by
    each (its usage), and they are not dropped."""

    async def transcribed(conn, transcription: dict) -> int:
        session = audio_session(vad=None, max_output_tokens=4)
        session["audio"]["input"]["transcription"] = transcription
        await conn.session.update(session=session)
        assert (await conn.recv()).type == "session.updated"
        await stream_audio(conn, speech_pcm(0.6), paced=False)
        await conn.input_audio_buffer.commit()
        async for event in conn:
            if event.type.startswith("conversation.item.input_audio_transcription."):
                if event.type.endswith(".delta"):
                    continue
                assert event.type.endswith(".completed"), event
                return event.usage.input_tokens
            assert event.type != "error", event
        raise AssertionError("the session ended before the transcription")

    async def run() -> None:
        # (each in a session of its own: a session's later clips read its earlier text)
        async with connect(omni_fleet, new_session_id()) as conn:
            await opened(conn)
            plain = await transcribed(conn, {"model": MODEL})
        async with connect(omni_fleet, new_session_id()) as conn:
            await opened(conn)
            assert await transcribed(conn, {"model": MODEL, "language": "en"}) > plain
        async with connect(omni_fleet, new_session_id()) as conn:
            await opened(conn)
            assert await transcribed(conn, {"model": MODEL, "prompt": "Names: Oslo."}) > plain

    asyncio.run(run())


def test_a_sessions_transcription_carries_its_earlier_text(omni_fleet: Fleet) -> None:
    """Six segments of one session, committed one after another: each is transcribed after
    the text of those before it (with the session's prompt first) and with the session's
    language, its deltas as the decoder writes them. Each segment's prompt is, token for token,
    what ``/v1/audio/transcriptions`` reads for the same audio with that language and that
    text as its ``prompt``: the same input tokens."""
    import io
    import wave

    segments = [speech_pcm(0.5 + 0.2 * (i % 3), seed=5 * i) for i in range(6)]

    async def run() -> list[tuple[str, str, int]]:
        got = []
        async with connect(omni_fleet, new_session_id()) as conn:
            await opened(conn)
            session = audio_session(vad=None, max_output_tokens=4)
            transcription = {"model": MODEL, "prompt": "Oslo.", "language": "en"}
            session["audio"]["input"]["transcription"] = transcription
            await conn.session.update(session=session)
            assert (await conn.recv()).type == "session.updated"
            for pcm in segments:
                await stream_audio(conn, pcm, paced=False)
                await conn.input_audio_buffer.commit()
            deltas: dict[str, str] = {}
            async for event in conn:
                assert event.type != "error", event
                if event.type == "conversation.item.input_audio_transcription.delta":
                    deltas[event.item_id] = deltas.get(event.item_id, "") + event.delta
                if event.type == "conversation.item.input_audio_transcription.completed":
                    tokens = event.usage.input_tokens
                    got.append((deltas.get(event.item_id, ""), event.transcript, tokens))
                    if len(got) == len(segments):
                        return got
        raise AssertionError("the session ended before its transcriptions")

    got = asyncio.run(run())
    client = openai.OpenAI(
        base_url=omni_fleet.routers[0].url + "/v1", api_key=omni_fleet.api_key, max_retries=0
    )
    earlier: list[str] = []
    for pcm, (deltas, transcript, tokens) in zip(segments, got, strict=True):
        assert deltas == transcript
        clip = io.BytesIO()
        with wave.open(clip, "wb") as w:
            w.setnchannels(1), w.setsampwidth(2), w.setframerate(24_000), w.writeframes(pcm)
        prompt = "\n".join(p for p in ["Oslo.", " ".join(t.strip() for t in earlier)] if p)
        rest = client.audio.transcriptions.create(
            model=MODEL, file=("clip.wav", clip.getvalue()), prompt=prompt, language="en",
            response_format="json",
        )  # fmt: skip
        assert rest.usage.input_tokens == tokens, (prompt, rest.usage, tokens)
        earlier.append(transcript)


def test_two_turns_second_sees_the_first(omni_fleet: Fleet) -> None:
    async def run() -> None:
        async with connect(omni_fleet, new_session_id()) as conn:
            await opened(conn)
            await conn.session.update(session=audio_session(max_output_tokens=6))
            first = await say(conn, "My name is Ada.")
            second = await say(conn, "What is my name?")
        # the second prompt holds the first turn (question and answer) before the new question
        u1, u2 = first.usage, second.usage
        assert u2.input_tokens >= u1.input_tokens + u1.output_tokens, (u1, u2)

    asyncio.run(run())


def test_cancelled_response_frees_its_stages(omni_fleet: Fleet) -> None:
    depth = "omni_worker_stage_queue_depth"

    async def run() -> None:
        sid = new_session_id()
        async with connect(omni_fleet, sid) as conn:
            await opened(conn)
            await conn.session.update(session=audio_session())  # as long as the model goes
            await say(conn, "Hello.", max_output_tokens=2)
            worker = bound_worker(omni_fleet, sid)
            aborted = worker_metric(omni_fleet, worker, "omni_worker_aborted_total")[""]
            busy: dict[str, float] = {}

            async def cancel_on_first_audio(event, r) -> None:
                if event.type == "response.output_audio.delta" and len(r.audio) == 0:
                    busy.update(worker_metric(omni_fleet, worker, depth))
                    await conn.response.cancel()

            await add_user_text(conn, "Talk for a long time.")
            await conn.response.create()
            r = await read_response(conn, cancel_on_first_audio)
            assert r.status == "cancelled", r.events
            assert any(busy.values()), busy  # the response was at work in the stages
            # a whole response runs for seconds more (128 tokens on this model): every stage
            # is idle long before that, and the worker counts the abort
            wait_until(
                lambda: not any(worker_metric(omni_fleet, worker, depth).values()),
                3,
                "stage queues empty after the cancel",
                interval=0.05,
            )
            assert worker_metric(omni_fleet, worker, "omni_worker_aborted_total")[""] == aborted + 1
            # the session lives on: the next response is whole
            again = await say(conn, "Short answer please.", max_output_tokens=4)
            assert again.status in FINISHED

    asyncio.run(run())


def test_worker_killed_mid_session_resumes_on_another(omni_fleet: Fleet) -> None:
    closes: list[int] = []

    def reconnecting(event):
        closes.append(event.close_code)
        return None  # same query and headers: the same session id

    async def run() -> tuple[str, str]:
        sid = new_session_id()
        async with connect(
            omni_fleet, sid, on_reconnecting=reconnecting, initial_delay=0.2
        ) as conn:
            await opened(conn)
            await conn.session.update(session=audio_session(max_output_tokens=6))
            first = await say(conn, "Remember the word: lantern.")
            victim = bound_worker(omni_fleet, sid)
            await add_user_text(conn, "Now talk for long.")
            await conn.response.create(response={"max_output_tokens": 400})
            cut = ""
            async for event in conn:  # the SDK's iterator reconnects on 1011
                if event.type == "response.created":
                    cut = event.response.id
                if event.type == "response.output_audio.delta" and not closes:
                    omni_fleet.signal_tree(omni_fleet.workers[victim], signal.SIGKILL)
                if event.type == "session.created":
                    break  # a fresh socket: the session, resumed on another worker
            assert closes == [1011], closes
            # the response the kill cut runs again on the new worker, whole, under its id
            rerun = await read_response(conn)
            assert rerun.id == cut and rerun.status in FINISHED, (rerun.id, cut, rerun.status)
            assert rerun.audio and rerun.transcript
            resumed = await say(conn, "Which word?")
            assert resumed.status in FINISHED
            # the history came back from Redis: the new prompt holds both earlier turns
            assert resumed.usage.input_tokens >= first.usage.input_tokens + (
                first.usage.output_tokens + rerun.usage.output_tokens
            )
            r = omni_fleet.redis_client()
            try:
                # (stored under the API key's id: ``fleet.conversations.conversation_name``)
                key = next(r.scan_iter(match=KEYS.conversation("*" + sid)))
                items = [orjson.loads(i) for i in r.lrange(key, 0, -1)]
            finally:
                r.close()
            replies = [i for i in items if i["role"] == "assistant"]
            # once each: the cut response is stored by its re-run only, whole
            assert len(replies) == 3, replies
            assert replies[1]["status"] == ("completed" if rerun.status == "completed"
                                            else "incomplete"), replies  # fmt: skip
            return victim, bound_worker(omni_fleet, sid)

    victim, now = asyncio.run(run())
    omni_fleet.retire(victim)
    assert now != victim and now in omni_fleet.workers


def test_draining_worker_finishes_then_closes_1012(omni_fleet: Fleet) -> None:
    closes: list[int] = []

    def reconnecting(event):
        closes.append(event.close_code)

    async def run() -> tuple[str, str]:
        sid = new_session_id()
        mgr = connect(omni_fleet, sid, on_reconnecting=reconnecting, initial_delay=0.2)
        async with mgr as conn:
            await opened(conn)
            await conn.session.update(session=audio_session(max_output_tokens=24))
            await say(conn, "Hello.")
            victim = bound_worker(omni_fleet, sid)
            await add_user_text(conn, "Tell me more.")
            await conn.response.create()

            async def drain_on_first_audio(event, r) -> None:
                if event.type == "response.output_audio.delta" and len(r.audio) == 0:
                    omni_fleet.workers[victim].proc.send_signal(signal.SIGTERM)

            r = await read_response(conn, drain_on_first_audio)
            assert r.status in FINISHED, r.events  # the response in flight finished
            async for event in conn:  # then 1012, and the SDK reconnects elsewhere
                if event.type == "session.created":
                    break
            assert closes == [1012], closes
            after = await say(conn, "Still there?")
            assert after.status in FINISHED
            return victim, bound_worker(omni_fleet, sid)

    victim, now = asyncio.run(run())
    assert omni_fleet.workers[victim].wait_exit(60) == 0
    omni_fleet.retire(victim)
    assert now != victim and now in omni_fleet.workers
