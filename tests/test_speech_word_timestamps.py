"""Word timestamps of synthesized speech (issue 32 item 3) through a real router with the
``openai`` SDK: a worker of tiny-qwen3-tts-aligned (Qwen3-TTS with a Qwen3-ForcedAligner stage,
both seeded tiny checkpoints) times the words of its own audio for requests that ask
(``word_timestamps``): in the ``X-Word-Timestamps`` header of a whole response, a
``speech.audio.word_timestamps`` event with ``stream_format: sse`` and ``speech.audio.done`` on
the speech WebSocket. The tiny aligner's times are meaningless; its words are the input's, in
order, and its times are ordered, within the audio and scaled by ``speed``."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from fleet.redis_server import RedisServer
from tests.fakes.procs import Router, wait_for
from tests.worker_procs import WorkerProcess
from worker.models.qwen3_asr.aligner import split_words

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MODEL = "tiny-qwen3-tts-aligned"
TEXT = "Hello there, world. It's 12 o'clock!"
SAY = {"model": MODEL, "voice": "vivian", "input": TEXT, "seed": 7, "temperature": 0.9}


@pytest.fixture(scope="module")
def router() -> Iterator[Router]:
    with RedisServer() as redis:
        worker = WorkerProcess(
            "--spec", f"configs/models/{MODEL}.yaml", "--gpus", "cpu", "--fleet", "aligned",
            "--tts_engine.engine.max_new_tokens", "24", redis_url=redis.url,
        )  # fmt: skip
        router = Router("--fleet", "aligned", "--redis-url", redis.url)
        try:
            worker.wait_ready(timeout=300)
            wait_for(lambda: router.ready()["routable_workers"] == 1, timeout=30)
            yield router
        finally:
            router.stop()
            worker.stop()


def _check(words: list[dict[str, Any]], seconds: float) -> None:
    assert [w["word"] for w in words] == split_words(TEXT)
    times = [t for w in words for t in (w["start"], w["end"])]
    assert times == sorted(times) and times[0] >= 0 and times[-1] <= seconds + 1e-3, words


def test_a_whole_response_carries_the_words_in_a_header(router: Router) -> None:
    sdk = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    extra = {"seed": SAY["seed"], "temperature": SAY["temperature"]}
    raw = sdk.audio.speech.with_raw_response.create(
        model=MODEL, voice="vivian", input=TEXT, response_format="pcm",
        extra_body={**extra, "word_timestamps": True},
    )  # fmt: skip
    pcm = raw.content
    words = json.loads(raw.headers["x-word-timestamps"])
    _check(words, len(pcm) / 2 / 24_000)
    # the same audio twice as fast: every time halved
    fast = sdk.audio.speech.with_raw_response.create(
        model=MODEL, voice="vivian", input=TEXT, response_format="pcm", speed=2.0,
        extra_body={**extra, "word_timestamps": True},
    )  # fmt: skip
    halved = json.loads(fast.headers["x-word-timestamps"])
    for w, h in zip(words, halved, strict=True):
        assert h["start"] == pytest.approx(w["start"] / 2, abs=1e-3)
        assert h["end"] == pytest.approx(w["end"] / 2, abs=1e-3)
    # not asked: no aligner runs, no header, the same audio
    plain = sdk.audio.speech.with_raw_response.create(
        model=MODEL, voice="vivian", input=TEXT, response_format="pcm", extra_body=extra
    )
    assert "x-word-timestamps" not in plain.headers and plain.content == pcm
    # a raw audio stream has nowhere to carry them
    with pytest.raises(openai.BadRequestError) as err:
        sdk.audio.speech.create(
            model=MODEL, voice="vivian", input=TEXT, response_format="pcm",
            extra_body={"stream": True, "word_timestamps": True},
        )  # fmt: skip
    assert err.value.code == "invalid_request"
    assert err.value.body["param"] == "word_timestamps"  # type: ignore[index]


def test_sse_and_the_speech_socket_end_with_the_words(router: Router) -> None:
    from websockets.sync.client import connect

    body = {**SAY, "response_format": "pcm", "stream_format": "sse", "word_timestamps": True}
    events = []
    with httpx.stream("POST", router.url + "/v1/audio/speech", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["speech.audio.word_timestamps", "speech.audio.done"], kinds
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events if "audio" in e)
    sse_words = events[-2]["words"]
    _check(sse_words, len(pcm) / 2 / 24_000)

    url = router.url.replace("http://", "ws://") + f"/v1/audio/speech/stream?model={MODEL}"
    with connect(url, open_timeout=30) as ws:
        create = {**SAY, "type": "speech.create", "word_timestamps": True}
        del create["model"]
        ws.send(json.dumps(create))
        ws.send(json.dumps({"type": "input_text.done"}))
        audio = bytearray()
        while (event := json.loads(ws.recv(timeout=120)))["type"] != "speech.audio.done":
            assert event["type"] in ("speech.created", "speech.audio.delta"), event
            audio += base64.b64decode(event.get("audio", ""))
    _check(event["words"], len(audio) / 2 / 24_000)
