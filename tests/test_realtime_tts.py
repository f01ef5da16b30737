"""/v1/realtime on a text-to-speech model (tiny-qwen3-tts: speech, no chat) through the
official ``openai`` SDK's realtime client: each response speaks the user's text since the last
reply (RequestKind.SPEECH). Its own file: the tiny TTS is slow on CPU (its random weights
never stop before the frame limit), so this module costs a worker start and one long reply."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from realtime_client import add_user_text, b64, read_response, silence_pcm
from test_realtime_worker import TOKEN, next_of
from worker_procs import WorkerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tts_worker(tmp_path_factory) -> Iterator[WorkerProcess]:
    w = WorkerProcess(
        "--spec",
        "configs/models/tiny-qwen3-tts.yaml",
        "--cache-dir",
        str(tmp_path_factory.mktemp("omni-cache-tts")),
        token=TOKEN,
    )
    try:
        yield w.wait_ready()
    finally:
        w.stop()
        w.kill()


async def test_text_to_speech_model_speaks_the_text(tts_worker: WorkerProcess) -> None:
    """A TTS spec (no chat): each response speaks the user's text since the last reply."""
    tts = openai.AsyncOpenAI(base_url=tts_worker.url + "/v1", api_key=TOKEN, max_retries=0)
    async with tts.realtime.connect(model="tiny-qwen3-tts") as conn:
        event = await conn.recv()
        assert event.session.audio.input.turn_detection is None  # no audio comes in
        assert event.session.audio.output.voice == "vivian"  # the first built-in voice
        await conn.input_audio_buffer.append(audio=b64(silence_pcm(0.1)))
        error, _ = await next_of(conn, "error")
        assert error.error.code == "invalid_request"
        await add_user_text(conn, "Hello there.")
        await conn.response.create()
        reply = await read_response(conn)
    assert reply.transcript == "Hello there."
    assert reply.audio_seconds > 0.2
    # max_output_tokens bounds a spoken response's frames (80 ms each; usage counts them)
    async with tts.realtime.connect(model="tiny-qwen3-tts") as conn:
        await conn.recv()
        await add_user_text(conn, "Hello again.")
        await conn.response.create(response={"max_output_tokens": 5})
        short = await read_response(conn)
    assert (short.status, short.usage.output_tokens) == ("incomplete", 5)
    assert short.audio_seconds <= 5 * 0.08
