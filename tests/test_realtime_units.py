"""/v1/realtime's own logic, fast: server VAD on espeak-ng's speech, and, in-process over real
WebSockets against the test-only FakePipeline (tests/worker_fakes.py), a failing stage and the
session length limit. The real model's sessions are tests/test_realtime_worker.py."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import numpy as np
import openai
import pytest
from realtime_client import (
    add_user_text,
    audio_session,
    read_response,
    recv_strict,
    silence_pcm,
    speech_pcm,
    stream_audio,
)
from spoken import pcm16
from test_worker_http import Running, serve_in_thread
from websockets.exceptions import ConnectionClosed

from planner.spec import ModelSpec
from worker.api.realtime.config import VadConfig
from worker.api.realtime.g711 import CODECS
from worker.api.realtime.turns import (
    ServerVad,
    SileroVad,
    SpeechStarted,
    SpeechStopped,
    batcher,
    silero,
)
from worker.settings import WorkerSettings

RATE = 24_000
SPEC = ModelSpec.model_validate(
    {
        "name": "fake-omni",
        "model_dir": ".",
        "capabilities": {
            "endpoints": ["chat", "realtime"],
            "input_modalities": ["text", "audio"],
            "output_modalities": ["text", "audio"],
        },
        "entry": "thinker",
        "stages": {"thinker": {"executor": "autoregressive", "terminal": True}},
    }
)


@pytest.mark.parametrize("silence_ms", [200, 500])
async def test_server_vad_marks_one_turn_per_utterance(silence_ms: int) -> None:
    """Silero VAD on real speech (espeak-ng's): each turn starts and ends within 100 ms of where
    its speech does; a 100 ms pause inside a turn does not end it, a second of silence does."""
    vad = ServerVad(VadConfig(silence_duration_ms=silence_ms))
    audio = silence_pcm(0.5) + speech_pcm(1.0) + silence_pcm(0.1) + speech_pcm(0.5, seed=3)
    audio += silence_pcm(1.0) + speech_pcm(0.6, seed=7) + silence_pcm(1.0)
    found = []
    for at in range(0, len(audio), 960):  # 20 ms appends, as a microphone sends
        found += await vad.feed(audio[at : at + 960])
    kinds = [type(t) for t in found]
    assert kinds == [SpeechStarted, SpeechStopped, SpeechStarted, SpeechStopped]
    first_start, first_stop, second_start, second_stop = (t.at / RATE for t in found)
    assert first_start == pytest.approx(0.5, abs=0.1)
    assert first_stop == pytest.approx(2.1, abs=0.1)
    assert found[1].until / RATE == pytest.approx(2.1 + silence_ms / 1000, abs=0.1)
    assert second_start == pytest.approx(3.1, abs=0.1)
    assert second_stop == pytest.approx(3.7, abs=0.1)


async def test_server_vad_ignores_noise() -> None:
    """Quiet and loud noise, hum and a click are no turn."""
    rng = np.random.default_rng(0)
    t = np.arange(2 * RATE) / RATE
    noises = [
        0.003 * rng.standard_normal(2 * RATE),
        0.2 * rng.standard_normal(2 * RATE),
        0.3 * np.sin(2 * np.pi * 50 * t),
        np.where(np.arange(2 * RATE) == RATE, 0.9, 0.0),
    ]
    for noise in noises:
        vad = ServerVad(VadConfig())
        assert await vad.feed(pcm16(noise)) == []


async def test_the_sessions_frames_are_scored_in_one_call_each_round(monkeypatch) -> None:
    """Frames of several sessions that arrive in one turn of the loop go through the model
    together, each session's in order, with the probabilities one session alone gets."""
    speech = [speech_pcm(0.5, seed=i) for i in range(3)]
    alone = []
    for pcm in speech:
        vad = ServerVad(VadConfig())
        alone.append(silero().probabilities(vad.stream, vad.frames(pcm)))
    calls = []
    step = SileroVad.step

    def counted(self, streams, frames):
        calls.append(len(streams))
        return step(self, streams, frames)

    monkeypatch.setattr(SileroVad, "step", counted)
    vads = [ServerVad(VadConfig()) for _ in speech]
    shared = batcher(asyncio.get_running_loop())
    got = await asyncio.gather(
        *(shared.score(v.stream, v.frames(p)) for v, p in zip(vads, speech, strict=True))
    )
    assert calls == [3] * len(alone[0])  # (0.5 s: 15 frames of 32 ms, one call each)
    for mine, theirs in zip(got, alone, strict=True):
        np.testing.assert_allclose(mine, theirs, atol=1e-5)


def test_g711_codes_decode_to_the_standard_values_and_back() -> None:
    ulaw, alaw = CODECS["audio/pcmu"], CODECS["audio/pcma"]
    # ITU-T G.711: mu-law 0x80/0x00 are the extremes, 0xFF and 0x7F zero; A-law 0xAA/0x2A
    # the extremes, 0xD5/0x55 the smallest steps
    assert [int(ulaw.table[c]) for c in (0x80, 0x00, 0xFF, 0x7F)] == [32124, -32124, 0, 0]
    assert [int(alaw.table[c]) for c in (0xAA, 0x2A, 0xD5, 0x55)] == [32256, -32256, 8, -8]
    for codec in (ulaw, alaw):
        codes = bytes(c for c in range(256) if c not in (0x7F,))  # 0x7F and 0xFF: both zero
        pcm = codec.decode(codes)  # 8 kHz -> 24 kHz
        assert len(pcm) == 2 * 3 * len(codes)
        assert codec.encode(pcm) == codes


@pytest.fixture
def fake_worker(request, redis_server) -> Iterator[Running]:
    settings = WorkerSettings(_cli_parse_args=[], **getattr(request, "param", {}))
    yield from serve_in_thread(settings, redis_server.url, spec=SPEC)


def connect(worker: Running):
    client = openai.AsyncOpenAI(base_url=worker.url + "/v1", api_key="none", max_retries=0)
    return client.realtime.connect(model="fake-omni")


async def turn(conn, text: str):
    await add_user_text(conn, text)
    await conn.response.create()
    return await read_response(conn)


async def test_a_failing_stage_fails_the_response_not_the_session(fake_worker: Running) -> None:
    async with connect(fake_worker) as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(session=audio_session(vad=None))
        with pytest.raises(Exception, match="stage_failed"):
            await turn(conn, "FAIL here")
        done = await conn.recv()
        while done.type != "response.done":  # the reply's item closes first (incomplete)
            done = await conn.recv()
        assert done.response.status == "failed"
        assert done.response.status_details.error.code == "stage_failed"
        reply = await turn(conn, "hello again")
        assert reply.status == "completed" and reply.transcript == "echo hello again"
        assert reply.audio


@pytest.mark.parametrize("fake_worker", [{"realtime_max_session_seconds": 1.0}], indirect=True)
async def test_a_session_ends_at_its_longest_life(fake_worker: Running) -> None:
    async with connect(fake_worker) as conn:
        assert (await conn.recv()).type == "session.created"
        event = await conn.recv()
        assert event.type == "error" and event.error.code == "session_expired"
        with pytest.raises(ConnectionClosed) as closed:
            await conn.recv()
        assert closed.value.rcvd.code == 1008
    assert fake_worker.service.realtime == set()


async def test_g711_in_and_out(fake_worker: Running) -> None:
    """A phone gateway's session: mu-law in, A-law out, both at 8 kHz."""
    async with connect(fake_worker) as conn:
        assert (await conn.recv()).type == "session.created"
        formats = {
            "input": {"format": {"type": "audio/pcmu"}, "turn_detection": None},
            "output": {"format": {"type": "audio/pcma"}},
        }
        await conn.session.update(session={"type": "realtime", "audio": formats})
        updated = await conn.recv()
        assert updated.session.audio.input.format.type == "audio/pcmu"
        assert updated.session.audio.output.format.type == "audio/pcma"
        ulaw = CODECS["audio/pcmu"].encode(speech_pcm(0.5))
        assert len(ulaw) == 4000
        await conn.input_audio_buffer.append(audio=base64.b64encode(ulaw).decode())
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        reply = await read_response(conn)
    request = fake_worker.pipeline.seen[-1]
    clip = request.messages[-1]["content"][0]["audio"]  # at the encoder's 16 kHz
    assert len(clip) == pytest.approx(8000, abs=2)
    # the fake pipeline answers in 0.1 s chunks of 24 kHz: 800 bytes of A-law each
    assert len(reply.audio) == 3 * 800


def test_function_calls_and_their_outputs_become_the_templates_tool_turns() -> None:
    """A reply's text and the calls after it are one assistant turn with ``tool_calls``; a
    call's output is a ``tool`` turn naming it; a client's item of one kind with another kind's
    fields is refused naming the field."""
    import asyncio

    from worker.api.realtime.conversation import Conversation, item_from_client, message_item
    from worker.api.realtime.errors import RealtimeError
    from worker.api.realtime.events import ItemIn

    conv = Conversation(None, "c", 16)
    user = message_item("user", [{"type": "input_text", "text": "Weather in Oslo?"}])
    said = message_item("assistant", [{"type": "output_text", "text": "Let me look."}])
    call = ItemIn(type="function_call", call_id="call_1", name="get_weather", arguments="{}")
    output = ItemIn(type="function_call_output", call_id="call_1", output='{"celsius": 21}')
    for item in (
        user,
        said,
        item_from_client(call, 1000, 1000),
        item_from_client(output, 1000, 1000),
    ):
        asyncio.run(conv.add(item))
    assert conv.messages("Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'},
    ]  # fmt: skip
    for bad, param in (
        (ItemIn(type="function_call_output", call_id="c", output="x", role="user"), "item.role"),
        (ItemIn(type="function_call", call_id="c", name="f"), "item.arguments"),
        (ItemIn(type="message", role="user", call_id="c"), "item.content"),
    ):
        with pytest.raises(RealtimeError) as err:
            item_from_client(bad, 1000, 1000)
        assert err.value.param == param, (bad, err.value)


async def test_semantic_vad_takes_eagerness_and_server_vad_refuses_it(fake_worker: Running) -> None:
    """semantic_vad's eagerness sets its longest pause (shown in session.updated) and a turn
    of speech ends with a committed item; eagerness under server_vad is a 400 naming it, the
    session going on as it was."""
    async with connect(fake_worker) as conn:
        assert (await conn.recv()).type == "session.created"
        vad = {"type": "semantic_vad", "eagerness": "high", "create_response": False}
        await conn.session.update(session=audio_session(vad=vad))
        updated = await conn.recv()
        shown = updated.session.audio.input.turn_detection
        assert (shown.type, shown.eagerness) == ("semantic_vad", "high")
        await conn.session.update(
            session=audio_session(vad={"type": "server_vad", "eagerness": "low"})
        )
        error = await conn.recv()
        assert error.type == "error" and error.error.code == "invalid_request"
        assert error.error.param == "session.audio.input.turn_detection.eagerness"
        pcm = silence_pcm(0.5) + speech_pcm(1.5) + silence_pcm(1.5)
        for at in range(0, len(pcm), 9600):
            await conn.input_audio_buffer.append(
                audio=base64.b64encode(pcm[at : at + 9600]).decode()
            )
        kinds = []
        while "input_audio_buffer.committed" not in kinds:
            kinds.append((await conn.recv()).type)
        assert kinds[:2] == [
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
        ]


ASR_SPEC = ModelSpec.model_validate(
    {
        "name": "fake-asr",
        "model_dir": ".",
        "capabilities": {
            "endpoints": ["transcription"],
            "input_modalities": ["audio"],
            "output_modalities": ["text"],
        },
        "entry": "asr",
        "stages": {"asr": {"executor": "autoregressive", "terminal": True}},
    }
)


@pytest.fixture
def fake_asr(redis_server) -> Iterator[Running]:
    yield from serve_in_thread(WorkerSettings(_cli_parse_args=[]), redis_server.url, spec=ASR_SPEC)


async def test_a_transcription_session_transcribes_each_turn_keeping_its_language(
    fake_asr: Running,
) -> None:
    """OpenAI's transcription session (``?intent=transcription``) on a worker that only
    transcribes: each committed segment is transcribed, in order, after the session's prompt,
    its keywords and the text before it; the first language the model detects that the API
    knows is the hint of the segments after it. Every event passes the SDK's models in strict
    mode; what a transcription session does not do is an error naming it."""
    fake_asr.pipeline.detects = ["Klingon", "German", "French"]  # (Klingon: unknown, not kept)
    client = openai.AsyncOpenAI(base_url=fake_asr.url + "/v1", api_key="none", max_retries=0)
    async with client.realtime.connect(
        model="fake-asr", extra_query={"intent": "transcription"}
    ) as conn:
        created = await recv_strict(conn)
        assert created.type == "session.created" and created.session.type == "transcription"
        transcription = {"model": "gpt-4o-transcribe", "prompt": "Oslo.", "keywords": ["fjord"]}
        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "transcription": transcription, "turn_detection": None}}})  # fmt: skip
        updated = await recv_strict(conn)
        assert updated.session.audio.input.transcription.keywords == ["fjord"]
        unknown = {"input": {"transcription": {"languages": ["xx"]}}}
        for bad, param in (
            ({"type": "transcription", "instructions": "Be brief."}, "session.instructions"),
            ({"type": "realtime"}, "session.type"),
            ({"type": "transcription", "audio": unknown},
             "session.audio.input.transcription.languages.0"),
        ):  # fmt: skip
            await conn.session.update(session=bad)
            error = await recv_strict(conn)
            assert error.type == "error" and error.error.param == param, error
        await conn.response.create()
        error = await recv_strict(conn)
        assert error.type == "error" and error.error.param == "type"
        for seconds in (0.5, 0.7, 0.9):
            await stream_audio(conn, speech_pcm(seconds), paced=False)
            await conn.input_audio_buffer.commit()
        completed = []
        while len(completed) < 3:
            event = await recv_strict(conn)
            assert event.type != "error", event
            if event.type == "conversation.item.input_audio_transcription.completed":
                completed.append(event.transcript)
    asked = [r.transcription for r in fake_asr.pipeline.seen]
    assert [o.language for o in asked] == [None, None, "German"]
    context = "Oslo.\nKeywords: fjord."
    assert [o.prompt for o in asked] == [
        context,
        f"{context}\n{completed[0]}",
        f"{context}\n{completed[0]} {completed[1]}",
    ]


async def test_a_transcription_session_needs_a_worker_that_transcribes(
    fake_worker: Running,
) -> None:
    client = openai.AsyncOpenAI(base_url=fake_worker.url + "/v1", api_key="none", max_retries=0)
    for query, code, param in (({"intent": "transcription"}, "endpoint_not_served", None),
                               ({"intent": "bogus"}, "invalid_request", "intent")):  # fmt: skip
        async with client.realtime.connect(model="fake-omni", extra_query=query) as conn:
            error = await recv_strict(conn)
            assert error.type == "error" and error.error.code == code, error
            assert error.error.param == param
            with pytest.raises(ConnectionClosed):
                await conn.recv()
