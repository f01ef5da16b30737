"""The speech API on the embedded tiny Qwen3-TTS checkpoints (real worker processes, HTTP):
every response format decodes to the same audio, speed changes the duration, streaming starts
before the end, batch speech equals one request at a time, uploaded voices clone on Base, and
every bad input gets a clear 4xx with a stable code."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.worker_procs import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
CV_SPEC = REPO / "configs" / "models" / "tiny-qwen3-tts.yaml"
BASE_SPEC = REPO / "configs" / "models" / "tiny-qwen3-tts-base.yaml"
MAX_NEW = 16  # talker steps per request (the embedded specs allow 64): keeps the test short
FRAMES = MAX_NEW - 1  # frames of 1920 samples (the last first code never gets its frame)
LIMIT = ("--tts_engine.engine.max_new_tokens", str(MAX_NEW))


@pytest.fixture(scope="module")
def cv(tmp_path_factory):
    cache = tmp_path_factory.mktemp("tts-cache")
    worker = WorkerProcess(
        "--spec", str(CV_SPEC), "--gpus", "cpu", "--cache-dir", str(cache), *LIMIT
    )  # fmt: skip
    try:
        yield worker.wait_ready(timeout=300)
    finally:
        worker.stop()


def _post(worker: WorkerProcess, body: dict, path: str = "/v1/audio/speech") -> httpx.Response:
    return httpx.post(worker.url + path, json={"model": "tiny-qwen3-tts", **body}, timeout=300)


def _decode(data: bytes) -> tuple[np.ndarray, int]:
    import av

    with av.open(io.BytesIO(data)) as c:
        frames = [f.to_ndarray().reshape(-1) for f in c.decode(audio=0)]
        rate = c.streams.audio[0].rate
    return np.concatenate(frames), rate


def _error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code, err
    assert err["message"]
    return err


def test_formats_speed_stream_and_batch(cv: WorkerProcess) -> None:
    body = {"input": "hello there", "voice": "vivian", "seed": 5}  # (sampled: one seed)
    pcm = _post(cv, {**body, "response_format": "pcm"}).content
    samples = np.frombuffer(pcm, "<i2")
    assert samples.size == FRAMES * 1920
    assert np.abs(samples).max() > 100  # audible, not silence
    wav = _post(cv, body).content
    data, rate = sf.read(io.BytesIO(wav), dtype="int16")
    assert rate == 24_000 and np.array_equal(data, samples)
    seconds = samples.size / 24_000
    for fmt in ("mp3", "flac", "opus", "aac"):
        r = _post(cv, {**body, "response_format": fmt})
        assert r.status_code == 200, r.text
        decoded, rate = _decode(r.content)
        assert abs(decoded.size / rate - seconds) < 0.1, fmt
        if fmt == "flac":  # lossless
            assert np.array_equal(decoded.astype(np.int16), samples)
    fast = np.frombuffer(_post(cv, {**body, "response_format": "pcm", "speed": 2.0}).content, "<i2")
    assert abs(fast.size / samples.size - 0.5) < 0.02
    slow = np.frombuffer(_post(cv, {**body, "response_format": "pcm", "speed": 0.5}).content, "<i2")
    assert abs(slow.size / samples.size - 2.0) < 0.04

    # streamed: the same audio, sent as the vocoder decodes it (first packet: one frame of 80 ms,
    # after one talker step), not in one piece at the end
    with httpx.stream(
        "POST", cv.url + "/v1/audio/speech", timeout=300,
        json={"model": "tiny-qwen3-tts", **body, "response_format": "pcm", "stream": True},
    ) as r:  # fmt: skip
        assert b"".join(r.iter_bytes()) == pcm
    # one event per vocoder chunk (independent of how TCP coalesces bytes)
    sse = httpx.post(
        cv.url + "/v1/audio/speech", timeout=300,
        json={"model": "tiny-qwen3-tts", **body, "stream_format": "sse"},
    ).text  # fmt: skip
    deltas = [
        base64.b64decode(json.loads(line[6:])["audio"])
        for line in sse.splitlines()
        if line.startswith("data: ") and "speech.audio.delta" in line
    ]
    assert b"".join(deltas) == pcm
    assert len(deltas) > 2 and len(deltas[0]) < len(pcm) // 2

    batch = _post(
        cv,
        {"voice": "ryan", "response_format": "pcm", "seed": 5,
         "inputs": [{"input": "hello there", "voice": "vivian"}, {"input": "second one"}]},
        "/v1/audio/speech/batch",
    )  # fmt: skip
    assert batch.status_code == 200, batch.text
    items = batch.json()["data"]
    assert [i["index"] for i in items] == [0, 1]
    assert base64.b64decode(items[0]["audio"]) == pcm
    # item i draws with seed + i
    one = {"input": "second one", "voice": "ryan", "response_format": "pcm", "seed": 6}
    assert base64.b64decode(items[1]["audio"]) == _post(cv, one).content
    # the language and the speaker change the audio
    de = _post(cv, {**body, "language": "German", "response_format": "pcm"}).content
    assert de != pcm and len(de) == len(pcm)


def test_speech_is_sampled_as_the_checkpoint_says_and_a_seed_repeats_it(cv: WorkerProcess) -> None:
    """The tiny CustomVoice checkpoint samples (its generation_config: do_sample, temperature
    0.9, top-k 50, for the talker and the sub-talker): the same seed gives the same bytes, other
    seeds other audio; ``temperature: 0`` is greedy (the same bytes whatever the seed); the
    request's fields are honoured (a low temperature is not the default's audio)."""

    def say(**kw: object) -> bytes:
        body = {"input": "hello there", "voice": "vivian", "response_format": "pcm", **kw}
        r = _post(cv, body)
        assert r.status_code == 200, r.text
        return r.content

    seeded = say(seed=1)
    assert say(seed=1) == seeded
    assert len({seeded, say(seed=2), say(seed=3)}) == 3
    greedy = say(temperature=0, seed=1)
    assert greedy == say(temperature=0, seed=2) and greedy != seeded
    assert say(seed=1, temperature=0.3) != seeded
    assert say(seed=1, top_k=3) != seeded
    err = _error(
        _post(cv, {"input": "x", "voice": "vivian", "temperature": 3}), 400, "invalid_request"
    )
    assert "temperature" in (err.get("param") or err["message"])


def test_bad_speech_inputs(cv: WorkerProcess) -> None:
    ok = {"input": "hello", "voice": "vivian"}
    _error(_post(cv, {**ok, "input": ""}), 400, "invalid_request")
    _error(_post(cv, {**ok, "input": "   "}), 400, "invalid_request")
    err = _error(_post(cv, {**ok, "input": "x" * 4097}), 400, "invalid_request")
    assert err["param"] == "input"
    err = _error(_post(cv, {**ok, "voice": "nobody"}), 400, "voice_not_found")
    assert err["param"] == "voice" and "vivian" in err["message"]
    err = _error(_post(cv, {**ok, "response_format": "ogg_vorbis"}), 400, "invalid_request")
    assert err["param"] == "response_format"
    _error(_post(cv, {**ok, "speed": 5.0}), 400, "invalid_request")
    err = _error(_post(cv, {**ok, "language": "klingon"}), 400, "invalid_request")
    assert "klingon" in err["message"]
    _error(
        _post(cv, {"inputs": [{"input": "a"}, {"input": ""}], "voice": "vivian"},
              "/v1/audio/speech/batch"),
        400, "invalid_request",
    )  # fmt: skip
    _error(
        _post(cv, {"inputs": [{"input": "a"}]}, "/v1/audio/speech/batch"), 400, "invalid_request"
    )
    # the worker still serves after all that
    assert _post(cv, {**ok, "response_format": "pcm"}).status_code == 200


def _wav(samples: np.ndarray, rate: int = 24_000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def test_base_clones_uploaded_voices_and_refuses_bad_ones(tmp_path: Path, redis_url: str) -> None:
    worker = WorkerProcess(
        "--spec", str(BASE_SPEC), "--gpus", "cpu", "--cache-dir", str(tmp_path),
        "--max-voice-seconds", "5", *LIMIT, redis_url=redis_url,
    )  # fmt: skip
    try:
        worker.wait_ready(timeout=300)
        t = np.arange(24_000) / 24_000
        tone = 0.3 * np.sin(2 * np.pi * 180 * t) + 0.02 * np.random.default_rng(1).normal(
            size=t.size
        )

        def upload(name: str, data: bytes, text: str = "") -> httpx.Response:
            return httpx.post(
                worker.url + "/v1/audio/voices",
                data={"name": name, **({"text": text} if text else {})},
                files={"file": ("v.wav", data, "audio/wav")},
                timeout=60,
            )

        assert upload("icl", _wav(tone), "what the tone says").status_code == 200
        assert upload("xvec", _wav(tone)).status_code == 200
        _error(upload("bad", b"RIFF\x00\x00garbage" * 10), 400, "invalid_audio")
        _error(upload("quiet", _wav(np.zeros(24_000))), 400, "invalid_audio")
        _error(upload("long", _wav(np.tile(tone, 6))), 400, "audio_too_long")

        def speak(voice: str) -> httpx.Response:
            # (sampled: one seed, or a draw may end the reply early)
            body = {"model": "tiny-qwen3-tts-base", "input": "cloned", "voice": voice,
                    "response_format": "pcm", "seed": 5}  # fmt: skip
            return httpx.post(worker.url + "/v1/audio/speech", json=body, timeout=300)

        a, b = speak("icl"), speak("xvec")
        assert a.status_code == 200 and b.status_code == 200, (a.text, b.text)
        assert len(a.content) == FRAMES * 1920 * 2 and a.content != b.content
        # Base has no built-in voices: a name that is not uploaded is unknown
        _error(speak("vivian"), 400, "voice_not_found")
    finally:
        worker.stop()
