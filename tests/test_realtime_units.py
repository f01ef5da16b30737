"""/v1/realtime's own logic, fast: server VAD on speech-like audio, and, in-process over real
WebSockets against the test-only FakeEngine (tests/worker_fakes.py), a failing stage and the
session length limit. The real model's sessions are tests/test_realtime_worker.py."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from realtime_client import audio_session, read_response, silence_pcm, speech_pcm
from test_worker_http import Running, serve_in_thread
from websockets.exceptions import ConnectionClosed

from planner.spec import ModelSpec
from worker.api.realtime.config import VadConfig
from worker.api.realtime.turns import ServerVad, SpeechStarted, SpeechStopped
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
def test_server_vad_marks_one_turn_per_utterance(silence_ms: int) -> None:
    vad = ServerVad(VadConfig(silence_duration_ms=silence_ms))
    audio = silence_pcm(0.5) + speech_pcm(1.0) + silence_pcm(0.1) + speech_pcm(0.5)
    audio += silence_pcm(1.0) + speech_pcm(0.6) + silence_pcm(1.0)
    found = []
    for at in range(0, len(audio), 960):  # 20 ms appends, as a microphone sends
        found += vad.feed(audio[at : at + 960])
    kinds = [type(t) for t in found]
    # a 100 ms pause is not the end of a turn; a second of silence is
    assert kinds == [SpeechStarted, SpeechStopped, SpeechStarted, SpeechStopped]
    first_start, first_stop, second_start, second_stop = (t.at / RATE for t in found)
    assert first_start == pytest.approx(0.5, abs=0.1)
    assert first_stop == pytest.approx(2.1, abs=0.15)
    assert found[1].until / RATE == pytest.approx(2.1 + silence_ms / 1000, abs=0.15)
    assert second_start == pytest.approx(3.1, abs=0.1)
    assert second_stop == pytest.approx(3.7, abs=0.15)  # the detector holds a little


def test_server_vad_ignores_quiet_noise() -> None:
    vad = ServerVad(VadConfig())
    assert vad.feed(silence_pcm(2.0)) == []


@pytest.fixture
def fake_worker(request, redis_server) -> Iterator[Running]:
    settings = WorkerSettings(_cli_parse_args=[], **getattr(request, "param", {}))
    yield from serve_in_thread(settings, redis_server.url, spec=SPEC)


def connect(worker: Running):
    client = openai.AsyncOpenAI(base_url=worker.url + "/v1", api_key="none", max_retries=0)
    return client.realtime.connect(model="fake-omni")


async def turn(conn, text: str):
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await conn.conversation.item.create(item=item)
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
