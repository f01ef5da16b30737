"""Every speech request reads its text once, as the official ``qwen-tts`` package does: long
replies (209 frames) through a real router and worker, driven with the ``openai`` SDK (and the
speech WebSocket for text streamed in), equal the package's waveform.

The stage once gave a request whose text came whole its text a second time after the prompt
that held it (built-in voices: from the first frame on; cloned voices in streaming-text mode:
the text and end-of-text twice over), and the reference tests did not see it: their replies
were 9 frames long, and their tiny checkpoints' codes hardly depend on the text at all. These
checkpoints (``configs/hf/tiny-qwen3-tts-*-sharp``: the tiny shapes with the talker's weights
initialised four times larger) speak differently for a different text, so a text read twice
shows within a few frames. Two shapes of each variant: CustomVoice for the built-in voices
(whole, streamed response, text streamed in), Base for the cloned ones (with the reference's
transcript, ICL; and from its x-vector only). Each reply also reports how many of its text's
positions the talker read (``usage.input_token_details.text_tokens``): its tokens and
end-of-text, once."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import openai
import pytest
import soundfile as sf

from fleet.redis_server import RedisServer
from tests.fakes.procs import Router, wait_for
from tests.models import qwen3_tts_reference as ref
from tests.worker_procs import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

FLEET = "text-once"
MAX_NEW = 210  # talker steps: 209 frames (the last first code never gets its frame)
CV = ["tiny-qwen3-tts-custom-voice-sharp", "tiny-qwen3-tts-custom-voice-wide-sharp"]
BASE = ["tiny-qwen3-tts-base-sharp", "tiny-qwen3-tts-base-wide-sharp"]
TEXT = "Every word of this sentence is read once."
WORDS = [w if i == 0 else " " + w for i, w in enumerate(TEXT.split(" "))]
REF_TEXT = "A reference."
# the package's runs per checkpoint, by index: built-in voice whole (generate_custom_voice's
# default) and in streaming-text mode (what text streamed in is read in); clones ICL and x-vector
CV_RUNS = [
    {"text": TEXT, "speaker": "vivian", "language": "English"},
    {"text": TEXT, "speaker": "vivian", "language": "English", "non_streaming_mode": False},
]
BASE_RUNS = [
    {"text": TEXT, "language": "English", "ref_text": REF_TEXT},
    {"text": TEXT, "language": "English", "x_vector_only": True},
]


@dataclass
class Setup:
    router: Router
    results: dict[str, dict]
    text_tokens: int  # the text's tokens (the tiny checkpoints share one tokenizer)

    def sdk(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.router.url + "/v1", api_key="unused", max_retries=0,
                             timeout=600)  # fmt: skip


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[Setup]:
    from transformers import AutoTokenizer

    tmp = tmp_path_factory.mktemp("qwen3-tts-text-once")
    checkpoints = ref.official_checkpoints(CV + BASE, tmp)
    _, stored = ref.reference_audio()
    np.save(tmp / "ref.npy", stored)
    runs = {name: [dict(r, max_new_tokens=MAX_NEW) for r in CV_RUNS] for name in CV}
    clone = {"ref_audio": str(tmp / "ref.npy"), "ref_sr": 24_000, "max_new_tokens": MAX_NEW}
    runs |= {name: [dict(r, **clone) for r in BASE_RUNS] for name in BASE}
    results = ref.official_generate(runs, checkpoints, tmp)
    tok = AutoTokenizer.from_pretrained(checkpoints[CV[0]])
    text_tokens = len(tok(TEXT, add_special_tokens=False)["input_ids"])
    with RedisServer() as redis:
        workers: list[WorkerProcess] = []
        router = None
        try:
            for name in CV + BASE:
                embedded = "tiny-qwen3-tts" if name in CV else "tiny-qwen3-tts-base"
                spec = ref.spec_for(embedded, checkpoints[name], tmp, MAX_NEW, served_as=name)
                workers.append(WorkerProcess(
                    "--spec", str(spec), "--gpus", "cpu", "--fleet", FLEET, "--cache-dir",
                    str(tmp), worker_id=name, redis_url=redis.url,
                ))  # fmt: skip
            router = Router("--fleet", FLEET, "--redis-url", redis.url, "--resync-interval-s",
                            "0.5")  # fmt: skip
            for w in workers:
                w.wait_ready(timeout=600)
            wait_for(lambda: router.ready()["routable_workers"] == len(workers), timeout=30)
            yield Setup(router, results, text_tokens)
        finally:
            if router is not None:
                router.stop()
            for w in workers:
                w.stop()


def _sse(sdk: openai.OpenAI, model: str, voice: str) -> tuple[np.ndarray, dict]:
    """A streamed response (``stream_format: sse``): its audio and its usage."""
    audio, usage = bytearray(), None
    with sdk.audio.speech.with_streaming_response.create(
        model=model, input=TEXT, voice=voice, response_format="pcm", stream_format="sse",
        extra_body={"temperature": 0, "language": "English"},
    ) as response:  # fmt: skip
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "speech.audio.delta":
                audio += base64.b64decode(event["audio"])
            else:
                assert event["type"] == "speech.audio.done", event
                usage = event["usage"]
    assert usage is not None, "the stream ended without speech.audio.done"
    return np.frombuffer(bytes(audio), dtype="<i2"), usage


def _read_once(usage: dict, setup: Setup, what: str) -> None:
    read = (usage.get("input_token_details") or {}).get("text_tokens")
    want = setup.text_tokens + 1  # its tokens, then end-of-text
    assert read == want, f"{what}: the talker read {read} text positions, not {want}"


@pytest.mark.parametrize("name", CV)
def test_a_built_in_voice_reads_its_text_once(name: str, setup: Setup) -> None:
    sdk, want = setup.sdk(), setup.results[name]["0.wav"]
    assert want.shape[0] == (MAX_NEW - 1) * ref.FRAME  # (the package never stopped early)
    whole = sdk.audio.speech.create(
        model=name, input=TEXT, voice="vivian", response_format="wav",
        extra_body={"temperature": 0, "language": "English"},
    ).content  # fmt: skip
    pcm, rate = sf.read(io.BytesIO(whole), dtype="int16")
    assert rate == 24_000
    ref.assert_same_speech(pcm, want, f"{name}, whole WAV")
    streamed, usage = _sse(sdk, name, "vivian")
    ref.assert_same_speech(streamed, want, f"{name}, streamed response")
    _read_once(usage, setup, f"{name}, built-in voice")


@pytest.mark.parametrize("name", CV)
def test_text_streamed_in_reads_each_word_once(name: str, setup: Setup) -> None:
    """Word by word over ``/v1/audio/speech/stream``: the package's streaming-text mode, each
    text position once however the words came."""
    from websockets.sync.client import connect

    url = setup.router.url.replace("http://", "ws://") + f"/v1/audio/speech/stream?model={name}"
    with connect(url, open_timeout=30) as ws:
        ws.send(json.dumps({"type": "speech.create", "voice": "vivian", "language": "English",
                            "temperature": 0, "input": WORDS[0]}))  # fmt: skip
        assert json.loads(ws.recv(timeout=60))["type"] == "speech.created"
        for word in WORDS[1:]:
            ws.send(json.dumps({"type": "input_text.delta", "delta": word}))
        ws.send(json.dumps({"type": "input_text.done"}))
        audio = bytearray()
        while (event := json.loads(ws.recv(timeout=300)))["type"] != "speech.audio.done":
            assert event["type"] == "speech.audio.delta", event
            audio += base64.b64decode(event["audio"])
    pcm = np.frombuffer(bytes(audio), dtype="<i2")
    ref.assert_same_speech(pcm, setup.results[name]["1.wav"], f"{name}, text streamed in")
    _read_once(event["usage"], setup, f"{name}, text streamed in")


@pytest.mark.parametrize("name", BASE)
def test_a_cloned_voice_reads_its_text_once(name: str, setup: Setup) -> None:
    sdk = setup.sdk()
    data, _ = ref.reference_audio()
    icl, xvec = f"icl-{name}", f"xvec-{name}"
    consent = sdk.audio.voice_consents.create(
        name="speaker", language="en-US", recording=("c.wav", data, "audio/wav")
    ).id
    sdk.audio.voices.create(name=icl, audio_sample=("ref.wav", data, "audio/wav"),
                            consent=consent, extra_body={"text": REF_TEXT})  # fmt: skip
    sdk.audio.voices.create(name=xvec, audio_sample=("ref.wav", data, "audio/wav"),
                            consent=consent)  # fmt: skip
    for i, voice in enumerate((icl, xvec)):
        pcm, usage = _sse(sdk, name, voice)
        ref.assert_same_speech(pcm, setup.results[name][f"{i}.wav"], f"{name}, {voice}")
        _read_once(usage, setup, f"{name}, {voice}")
