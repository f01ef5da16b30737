"""Every shipped model family behind a real omni-router, driven with the official ``openai``
SDK as a user deploys it: one Redis, one router, and a worker each of Qwen3-TTS CustomVoice
(built-in voices), Qwen3-TTS Base (cloned voices) and Qwen3-ASR with its forced aligner (word
timestamps), each on its embedded tiny checkpoint. Each endpoint its spec advertises goes
client -> router -> worker. (Qwen3-Omni's fleet, three tiny-omni workers behind two routers, is
``test_openai_sdk.py`` and ``test_realtime_fleet.py``.)

Through the router, speech on a TTS worker and transcriptions on an ASR worker were refused
503 ``no_eligible_worker``: the router asked speech for text *and* audio out and a
transcription for text in, while a TTS worker advertises audio out only and an ASR worker audio
in only."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from prometheus_client.parser import text_string_to_metric_families

from fleet.records import PROMPT_UTF8, VoiceRecord
from fleet.redis_server import RedisServer
from fleet.store import FleetStore, connect
from planner.spec import ModelSpec
from tests.fakes.procs import Router, wait_for
from tests.worker_procs import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FLEET = "families"
MAX_NEW = 16  # talker steps per request: short replies on two cores
FRAMES = MAX_NEW - 1  # 1920-sample frames (the last code never gets its frame)
WORKERS = {
    "tiny-qwen3-tts": ("configs/models/tiny-qwen3-tts.yaml", "--tts_engine.engine.max_new_tokens"),
    "tiny-qwen3-tts-base": (
        "configs/models/tiny-qwen3-tts-base.yaml",
        "--tts_engine.engine.max_new_tokens",
    ),
    "tiny-qwen3-asr": ("configs/models/tiny-qwen3-asr.yaml", "--asr.engine.max_new_tokens"),
}


# the shipped production spec of each family, served on the family's tiny checkpoint
PRODUCTION = {
    "tiny-qwen3-tts": ("qwen3-tts-12hz-0.6b", "--tts_engine.engine.max_new_tokens"),
    "tiny-qwen3-tts-base": ("qwen3-tts-12hz-1.7b", "--tts_engine.engine.max_new_tokens"),
    "tiny-qwen3-asr": ("qwen3-asr-0.6b-aligned", "--asr.engine.max_new_tokens"),
}


@dataclass
class FamilyFleet:
    router: Router
    workers: dict[str, WorkerProcess]
    redis_url: str
    caches: dict[str, Path]

    def sdk(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.router.url + "/v1", api_key="unused", max_retries=0,
                             timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[FamilyFleet]:
    with RedisServer() as redis:
        workers: dict[str, WorkerProcess] = {}
        caches = {m: tmp_path_factory.mktemp(f"cache-{m}") for m in WORKERS}
        router = None
        try:
            for model, (spec, limit) in WORKERS.items():
                workers[model] = WorkerProcess(
                    "--spec", spec, "--gpus", "cpu", "--fleet", FLEET, limit, str(MAX_NEW),
                    "--cache-dir", str(caches[model]), worker_id=model, redis_url=redis.url,
                )  # fmt: skip
            router = Router("--fleet", FLEET, "--redis-url", redis.url, "--resync-interval-s",
                            "0.5")  # fmt: skip
            for w in workers.values():
                w.wait_ready(timeout=600)
            wait_for(lambda: router.ready()["routable_workers"] == len(workers), timeout=30)
            yield FamilyFleet(router, workers, redis.url, caches)
        finally:
            if router is not None:
                router.stop()
            for w in workers.values():
                w.stop()


def tone_wav(seconds: float, rate: int = 24_000, freq: float = 180.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    noise = 0.02 * np.random.default_rng(1).normal(size=t.size)
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * freq * t) + noise).astype(np.float32), rate,
             format="WAV")  # fmt: skip
    return buf.getvalue()


def test_models_list_each_familys_capabilities_and_voices(fleet: FamilyFleet) -> None:
    sdk = fleet.sdk()
    models = {m.id: m.model_dump() for m in sdk.models.list().data}
    assert set(models) == set(WORKERS)
    cv, base, asr = (models[m] for m in WORKERS)
    builtin = httpx.get(fleet.workers["tiny-qwen3-tts"].url + "/v1/models").json()["data"][0]
    assert cv["voices"] == builtin["voices"] and cv["voices"]  # what the worker says
    # OpenAI's voice names, as the spec maps them to the checkpoint's speakers
    shown = httpx.get(fleet.workers["tiny-qwen3-tts"].url + "/v1/audio/voices").json()["data"]
    aliases = {v["id"]: v["alias_of"] for v in shown if "alias_of" in v}
    assert len(aliases) == 13 and aliases["alloy"] == "vivian" and aliases["ash"] == "ryan"
    assert cv["voices"] == [v["id"] for v in shown]
    assert cv["capabilities"] == builtin["capabilities"]
    assert cv["capabilities"]["output_modalities"] == ["audio"]
    assert base["voices"] == []  # Base clones uploaded voices only
    assert base["capabilities"]["endpoints"] == ["speech", "voices", "realtime"]
    assert asr["capabilities"]["endpoints"] == ["transcription"]
    assert asr["capabilities"]["input_modalities"] == ["audio"]
    assert sdk.models.retrieve("tiny-qwen3-asr").id == "tiny-qwen3-asr"


def test_custom_voice_speech_streamed_speech_and_realtime(fleet: FamilyFleet) -> None:
    sdk = fleet.sdk()
    voice = sdk.models.retrieve("tiny-qwen3-tts").model_dump()["voices"][0]
    # (greedy: the random weights never stop before the frame limit)
    seeded = {"temperature": 0}
    raw = sdk.audio.speech.with_raw_response.create(
        model="tiny-qwen3-tts", input="Hello through the router.", voice=voice,
        response_format="pcm", extra_body=seeded,
    )  # fmt: skip
    assert raw.headers["x-omni-worker-id"] == "tiny-qwen3-tts"
    pcm = raw.content
    assert len(pcm) == FRAMES * 1920 * 2
    assert voice == "vivian"  # and OpenAI's "alloy" speaks as vivian (the spec's voice_aliases)
    assert pcm == sdk.audio.speech.create(
        model="tiny-qwen3-tts", input="Hello through the router.", voice="alloy",
        response_format="pcm", extra_body=seeded,
    ).content  # fmt: skip
    with sdk.audio.speech.with_streaming_response.create(
        model="tiny-qwen3-tts", input="Hello through the router.", voice=voice,
        response_format="pcm", extra_body={"stream": True, **seeded},
    ) as streamed:  # fmt: skip
        pieces = list(streamed.iter_bytes())
    assert b"".join(pieces) == pcm  # the same audio, streamed
    wav = sdk.audio.speech.create(
        model="tiny-qwen3-tts", input="Hello through the router.", voice=voice,
        response_format="wav", extra_body=seeded,
    ).content  # fmt: skip
    samples, rate = sf.read(io.BytesIO(wav), dtype="int16")
    assert rate == 24_000 and samples.tobytes() == pcm
    # an unknown voice is the client's mistake: 400, and the worker stays routable
    with pytest.raises(openai.BadRequestError) as err:
        sdk.audio.speech.create(model="tiny-qwen3-tts", input="x", voice="nobody")
    assert err.value.code == "voice_not_found"
    # the 0.6B does not follow instructions (the official package drops them): refused, naming
    # the field, whole and streamed
    for extra in ({}, {"stream": True}):
        with pytest.raises(openai.BadRequestError) as err:
            sdk.audio.speech.create(
                model="tiny-qwen3-tts", input="x", voice=voice, instructions="Whisper.",
                extra_body=extra,
            )  # fmt: skip
        assert err.value.param == "instructions" and "1.7B" in err.value.message, err.value

    async def realtime() -> tuple[str, int]:
        client = openai.AsyncOpenAI(
            base_url=fleet.router.url + "/v1", api_key="unused", max_retries=0
        )
        async with client.realtime.connect(model="tiny-qwen3-tts") as conn:
            await conn.recv()  # session.created
            await conn.conversation.item.create(
                item={"type": "message", "role": "user",
                      "content": [{"type": "input_text", "text": "Hello there."}]}
            )  # fmt: skip
            await conn.response.create()
            transcript, audio = "", 0
            async for event in conn:
                if event.type == "response.output_audio.delta":
                    audio += len(base64.b64decode(event.delta))
                elif event.type == "response.output_audio_transcript.delta":
                    transcript += event.delta
                elif event.type == "response.done":
                    return transcript, audio
        raise AssertionError("the session ended before response.done")

    transcript, audio_bytes = asyncio.run(realtime())
    assert transcript == "Hello there." and audio_bytes > 0


def _telephone(pcm: bytes, fmt: str) -> bytes:
    """24 kHz pcm16 -> G.711 at 8 kHz, by FFmpeg's resampler and encoder directly."""
    import av

    resampler = av.AudioResampler(format="s16", layout="mono", rate=8_000)
    frame = av.AudioFrame.from_ndarray(
        np.frombuffer(pcm, "<i2").reshape(1, -1), format="s16", layout="mono"
    )
    frame.sample_rate, frame.pts = 24_000, 0
    codec = av.CodecContext.create({"mulaw": "pcm_mulaw", "alaw": "pcm_alaw"}[fmt], "w")
    assert isinstance(codec, av.AudioCodecContext)
    codec.sample_rate, codec.format, codec.layout = 8_000, "s16", "mono"
    codec.open()
    out = b""
    for f in [*resampler.resample(frame), *resampler.resample(None)]:
        out += b"".join(bytes(p) for p in codec.encode(f))
    return out + b"".join(bytes(p) for p in codec.encode(None))


def test_speech_sample_rates_telephony_formats_and_voice_objects(fleet: FamilyFleet) -> None:
    """sample_rate resamples (wav says its rate), mulaw / alaw are G.711 at 8 kHz whole and
    streamed, the voice may come as {"id": name}; what a format cannot carry is a 400 naming
    sample_rate; word timestamps without an aligner stage are a 400 naming word_timestamps
    (tests/test_speech_word_timestamps.py times words on a spec with one)."""
    sdk = fleet.sdk()
    voice = sdk.models.retrieve("tiny-qwen3-tts").model_dump()["voices"][0]
    body = {"model": "tiny-qwen3-tts", "input": "Hello.", "voice": voice, "temperature": 0}

    def speak(**kw: Any) -> httpx.Response:
        return httpx.post(fleet.router.url + "/v1/audio/speech", json={**body, **kw}, timeout=300)

    pcm = speak(response_format="pcm").content
    assert len(pcm) == FRAMES * 1920 * 2
    assert speak(response_format="pcm", voice={"id": voice}).content == pcm
    wav = speak(response_format="wav", sample_rate=16_000).content
    samples, rate = sf.read(io.BytesIO(wav), dtype="int16")
    assert rate == 16_000 and samples.size == FRAMES * 1280
    assert len(speak(response_format="pcm", sample_rate=48_000).content) == len(pcm) * 2
    for fmt in ("mulaw", "alaw"):
        whole = speak(response_format=fmt)
        assert whole.headers["content-type"] == {"mulaw": "audio/pcmu", "alaw": "audio/pcma"}[fmt]
        assert whole.content == _telephone(pcm, fmt) and len(whole.content) == FRAMES * 640
        with httpx.stream("POST", fleet.router.url + "/v1/audio/speech", timeout=300,
                          json={**body, "response_format": fmt, "stream": True}) as r:  # fmt: skip
            assert b"".join(r.iter_bytes()) == whole.content
    mp3 = sdk.audio.speech.create(
        model="tiny-qwen3-tts", input="Hello.", voice=voice, response_format="mp3",
        extra_body={"temperature": 0, "sample_rate": 22_050},
    ).content  # fmt: skip
    assert sf.info(io.BytesIO(mp3)).samplerate == 22_050
    for fmt, rate in (("mulaw", 16_000), ("opus", 44_100), ("pcm", 12_345)):
        refused = speak(response_format=fmt, sample_rate=rate)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "sample_rate", refused.text
    refused = speak(response_format="pcm", word_timestamps=True)
    assert refused.status_code == 400 and "no aligner stage" in refused.text, refused.text
    assert refused.json()["error"]["param"] == "word_timestamps", refused.text


def test_voice_consents_through_the_router(fleet: FamilyFleet) -> None:
    """OpenAI's voice consents with the SDK: created from a recording, listed page by page,
    read, renamed, deleted; a voice names one by id, and an unknown id is a 400 naming
    ``consent``; a bad language or a silent recording is a 400 naming its field."""
    sdk = fleet.sdk()
    recording = ("c.wav", tone_wav(1.0), "audio/wav")
    made = [
        sdk.audio.voice_consents.create(name=f"speaker-{i}", language="en-US", recording=recording)
        for i in range(3)
    ]
    assert all(c.object == "audio.voice_consent" and c.id.startswith("cons_") for c in made)
    first = sdk.audio.voice_consents.list(limit=2)
    assert [c.id for c in first.data] == [c.id for c in made[:2]] and first.has_more
    rest = sdk.audio.voice_consents.list(limit=2, after=made[1].id)
    assert [c.id for c in rest.data] == [made[2].id] and not rest.has_more
    assert sdk.audio.voice_consents.retrieve(made[0].id).language == "en-US"
    assert sdk.audio.voice_consents.update(made[0].id, name="renamed").name == "renamed"
    assert sdk.audio.voice_consents.retrieve(made[0].id).name == "renamed"
    gone = sdk.audio.voice_consents.delete(made[2].id)
    assert (gone.id, gone.deleted) == (made[2].id, True)
    with pytest.raises(openai.NotFoundError):
        sdk.audio.voice_consents.retrieve(made[2].id)
    with pytest.raises(openai.BadRequestError) as err:
        sdk.audio.voices.create(name="x", audio_sample=recording, consent="cons_missing")
    assert err.value.param == "consent"
    silent = io.BytesIO()
    sf.write(silent, np.zeros(24_000, np.float32), 24_000, format="WAV")
    for field, kw in {
        "language": {"language": "English!", "recording": recording},
        "recording": {"language": "en", "recording": ("s.wav", silent.getvalue(), "audio/wav")},
    }.items():
        with pytest.raises(openai.BadRequestError) as err:
            sdk.audio.voice_consents.create(name="bad", **kw)
        assert err.value.param == field
    for consent in made[:2]:
        sdk.audio.voice_consents.delete(consent.id)


def test_base_clones_a_voice_uploaded_through_the_router(fleet: FamilyFleet) -> None:
    sdk = fleet.sdk()
    recording = ("c.wav", tone_wav(1.0), "audio/wav")
    consent = sdk.audio.voice_consents.create(name="me", language="en", recording=recording).id
    created = sdk.audio.voices.create(
        name="mine", audio_sample=("v.wav", tone_wav(1.0), "audio/wav"), consent=consent
    )
    assert created.name == "mine" and created.id == "mine" and created.type == "audio_sample"
    assert created.object == "audio.voice" and created.created_at > 0
    listed = httpx.get(fleet.router.url + "/v1/audio/voices", timeout=30).json()["data"]
    assert [v["name"] for v in listed] == ["mine"] and listed[0]["consent"] == consent
    pcm = sdk.audio.speech.create(
        model="tiny-qwen3-tts-base", input="cloned", voice="mine", response_format="pcm",
        extra_body={"temperature": 0},  # (greedy: the random weights never stop early)
    ).content  # fmt: skip
    assert len(pcm) == FRAMES * 1920 * 2 and any(pcm)
    for voice in ("vivian", "alloy"):  # Base has no built-in voices, so no OpenAI names
        with pytest.raises(openai.BadRequestError) as err:
            sdk.audio.speech.create(model="tiny-qwen3-tts-base", input="x", voice=voice)
        assert err.value.code == "voice_not_found" and err.value.param == "voice"
    with pytest.raises(openai.BadRequestError) as err:  # Base does not design voices
        sdk.audio.voices.create(name="designed", type="prompt", prompt="a calm voice",
                                extra_query={"model": "tiny-qwen3-tts-base"})  # fmt: skip
    assert err.value.param == "type" and "'tiny-qwen3-tts-base'" in err.value.message
    with pytest.raises(openai.NotFoundError) as err:  # the router routes by ?model=
        sdk.audio.voices.create(name="designed", type="prompt", prompt="a calm voice",
                                extra_query={"model": "tiny-qwen3-tts"})  # fmt: skip
    assert "'voices' for model 'tiny-qwen3-tts'" in err.value.message
    # a voice designed from words elsewhere in the fleet (stored by a VoiceDesign worker)
    prompt = "A calm voice."
    record = VoiceRecord(name="described", bytes=len(prompt), format=PROMPT_UTF8,
                         type="prompt", prompt=prompt)  # fmt: skip

    async def store_designed() -> None:
        store = FleetStore(connect(fleet.redis_url), FLEET)
        await store.put_voice(record, prompt.encode())
        await store.close()

    asyncio.run(store_designed())
    listed = {v["id"]: v for v in httpx.get(fleet.router.url + "/v1/audio/voices").json()["data"]}
    assert listed["described"]["type"] == "prompt" and "consent" not in listed["described"]
    with pytest.raises(openai.BadRequestError) as err:  # Base cannot speak it: refused
        sdk.audio.speech.create(model="tiny-qwen3-tts-base", input="x", voice="described")
    assert err.value.param == "voice" and "designed from words" in err.value.message
    assert sdk.audio.voices.delete("described").deleted
    with pytest.raises(openai.BadRequestError) as err:  # a Base clones: no instructions
        sdk.audio.speech.create(
            model="tiny-qwen3-tts-base", input="x", voice="mine", instructions="Whisper."
        )
    assert err.value.param == "instructions", err.value
    deleted = sdk.audio.voices.delete("mine")
    assert (deleted.object, deleted.id, deleted.deleted) == ("audio.voice.deleted", "mine", True)
    with pytest.raises(openai.BadRequestError):
        sdk.audio.speech.create(model="tiny-qwen3-tts-base", input="x", voice="mine")


def _first_bytes(metrics: str, model: str) -> float:
    """The router's count of streams whose first bytes came from ``model``'s workers (speech)."""
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "omni_router_first_byte_seconds_count" and sample.labels == {
                "route": "speech",
                "model": model,
            }:
                return sample.value
    return 0.0


def test_the_router_times_first_audio_per_model(fleet: FamilyFleet) -> None:
    """Two TTS models on one route: the router's first-byte times (a speech stream's first
    audio) and each worker's own are series of their model, so a mixed fleet's dashboards keep
    them apart (deploy/grafana: by model)."""
    sdk = fleet.sdk()
    sample = ("v.wav", tone_wav(1.0), "audio/wav")
    consent = sdk.audio.voice_consents.create(name="me", language="en", recording=sample).id
    sdk.audio.voices.create(name="timed", audio_sample=sample, consent=consent)
    models = {"tiny-qwen3-tts": "vivian", "tiny-qwen3-tts-base": "timed"}
    before = httpx.get(fleet.router.url + "/metrics", timeout=30).text
    runs = {"tiny-qwen3-tts": 2, "tiny-qwen3-tts-base": 1}
    for model, voice in models.items():
        for _ in range(runs[model]):
            body = {"model": model, "input": "x", "voice": voice, "stream": True, "temperature": 0}
            with httpx.stream("POST", fleet.router.url + "/v1/audio/speech", json=body,
                              timeout=300) as r:  # fmt: skip
                assert r.status_code == 200 and b"".join(r.iter_bytes())
    after = httpx.get(fleet.router.url + "/metrics", timeout=30).text
    for model, n in runs.items():
        assert _first_bytes(after, model) - _first_bytes(before, model) == n, model
        worker = httpx.get(fleet.workers[model].url + "/metrics", timeout=30).text
        assert f'omni_worker_first_audio_seconds_count{{kind="speech",model="{model}"}}' in worker
    sdk.audio.voices.delete("timed")


def test_transcription_with_word_timestamps_and_streamed(fleet: FamilyFleet) -> None:
    sdk = fleet.sdk()
    audio = ("a.wav", tone_wav(2.0, rate=16_000, freq=330.0), "audio/wav")
    plain = sdk.audio.transcriptions.create(model="tiny-qwen3-asr", file=audio)
    assert isinstance(plain.text, str)
    # Qwen3-ASR writes what it hears: no worker of this fleet advertises translations
    with pytest.raises(openai.NotFoundError) as err:
        sdk.audio.translations.create(model="tiny-qwen3-asr", file=audio)
    assert err.value.code == "endpoint_not_served"
    verbose = sdk.audio.transcriptions.create(
        model="tiny-qwen3-asr", file=audio, response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )  # fmt: skip
    assert verbose.text == plain.text and verbose.duration == pytest.approx(2.0, abs=0.01)
    assert verbose.segments and verbose.words is not None
    for word in verbose.words:  # (a random-weight aligner may time words past the clip)
        assert word.word and word.word in plain.text and 0 <= word.start <= word.end
    if plain.text.strip():
        assert verbose.words, "a transcript with text has timed words"
    # temperature is honoured (it was accepted and ignored): 0 is greedy, 1 samples
    zero = sdk.audio.transcriptions.create(model="tiny-qwen3-asr", file=audio, temperature=0)
    assert zero.text == plain.text
    sampled = {sdk.audio.transcriptions.create(model="tiny-qwen3-asr", file=audio,
                                               temperature=1.0).text for _ in range(4)}  # fmt: skip
    assert sampled != {plain.text}, sampled
    events = list(sdk.audio.transcriptions.create(model="tiny-qwen3-asr", file=audio,
                                                  stream=True))  # fmt: skip
    assert events[-1].type == "transcript.text.done" and events[-1].text == plain.text
    deltas = "".join(e.delta for e in events if e.type == "transcript.text.delta")
    assert deltas == plain.text


def test_transcription_takes_openais_current_fields(fleet: FamilyFleet) -> None:
    """openai 3.x's transcription fields through the router: ``keywords`` join the model's
    context after the ``prompt`` (the prompt grows by them: its input tokens, against the same
    words given as ``prompt``), one of ``languages`` is the language hint (the same input as
    ``language``) and ``languages`` is answered with what the model wrote, as codes; what the
    model cannot do is a 400 naming the field."""
    sdk = fleet.sdk()
    audio = ("a.wav", tone_wav(1.0, rate=16_000, freq=330.0), "audio/wav")

    def asr(**kw):
        return sdk.audio.transcriptions.create(model="tiny-qwen3-asr", file=audio, **kw)

    plain = asr(prompt="Oslo.").usage.input_tokens
    keyed = asr(prompt="Oslo.", keywords=["fjord", "Bergen"])
    as_prompt = asr(prompt="Oslo.\nKeywords: fjord, Bergen.")
    assert keyed.usage.input_tokens == as_prompt.usage.input_tokens > plain
    hinted = asr(languages=["en"])
    assert hinted.usage.input_tokens == asr(language="English").usage.input_tokens
    # OpenAI's ``language`` is ISO-639-1: the model is given its own name for it
    assert asr(language="en").usage.input_tokens == hinted.usage.input_tokens
    assert hinted.model_dump()["languages"] == ["en"]
    refused = {
        "languages": {"languages": ["en", "de"]},
        "known_speaker_names": {"known_speaker_names": ["agent"],
                                "known_speaker_references": ["data:audio/wav;base64,AAAA"]},
        "include": {"include": ["logprobs"]},
        "chunking_strategy": {"chunking_strategy": {"type": "server_vad"}},
    }  # fmt: skip
    for field, kw in refused.items():
        with pytest.raises(openai.BadRequestError) as err:
            asr(**kw)
        assert (err.value.param or "").startswith(field), (field, err.value)
    assert asr(chunking_strategy="auto").text == asr().text


def test_production_specs_on_the_tiny_checkpoints_equal_the_tiny_specs(fleet: FamilyFleet) -> None:
    """Each family's shipped spec (GPU sizes, bf16 on GPU stages) served with ``--model-dir``
    and ``--gpus cpu`` on the tiny checkpoint gives what the tiny spec (fp32, proven equal to
    the official packages by the reference tests) gives: every stage runs fp32 on the CPU.
    With the spec's bf16 kept, as before, the codes and the ASR text differed."""
    import yaml

    from worker.models.checkpoint import resolve_checkpoint

    production: dict[str, WorkerProcess] = {}
    try:
        for model, (spec, limit) in PRODUCTION.items():
            tiny_spec = Path(WORKERS[model][0])
            tiny = ModelSpec.model_validate(yaml.safe_load(tiny_spec.read_text()))
            checkpoint = resolve_checkpoint(tiny, tiny_spec, fleet.caches[model], log=print)
            production[model] = WorkerProcess(
                "--spec", f"configs/models/{spec}.yaml", "--model-dir", str(checkpoint),
                "--gpus", "cpu", "--fleet", FLEET + "-production", limit, str(MAX_NEW),
                redis_url=fleet.redis_url,
            )  # fmt: skip
        for w in production.values():
            w.wait_ready(timeout=600)
        assert "tts_engine:fp32" in production["tiny-qwen3-tts"].log(400)  # said at start-up

        def speech(w: WorkerProcess, model: str, voice: str) -> bytes:
            body = {"model": model, "input": "Equal on both specs.", "voice": voice,
                    "response_format": "pcm", "seed": 17}  # fmt: skip
            r = httpx.post(w.url + "/v1/audio/speech", json=body, timeout=300)
            assert r.status_code == 200, r.text
            return r.content

        voice = httpx.get(fleet.workers["tiny-qwen3-tts"].url + "/v1/models").json()
        voice = voice["data"][0]["voices"][0]
        assert speech(production["tiny-qwen3-tts"], "qwen3-tts-12hz-0.6b", voice) == speech(
            fleet.workers["tiny-qwen3-tts"], "tiny-qwen3-tts", voice
        )
        for w in (production["tiny-qwen3-tts-base"], fleet.workers["tiny-qwen3-tts-base"]):
            up = httpx.post(
                w.url + "/v1/audio/voices", data={"name": "ref", "text": "what the tone says"},
                files={"file": ("v.wav", tone_wav(1.0), "audio/wav")}, timeout=60,
            )  # fmt: skip
            assert up.status_code == 200, up.text
        assert speech(production["tiny-qwen3-tts-base"], "qwen3-tts-12hz-1.7b", "ref") == speech(
            fleet.workers["tiny-qwen3-tts-base"], "tiny-qwen3-tts-base", "ref"
        )

        def words(w: WorkerProcess, model: str) -> dict:
            form = {"model": model, "response_format": "verbose_json",
                    "timestamp_granularities[]": ["word"]}  # fmt: skip
            audio = ("a.wav", tone_wav(2.0, rate=16_000, freq=330.0), "audio/wav")
            r = httpx.post(w.url + "/v1/audio/transcriptions", data=form, files={"file": audio},
                           timeout=300)  # fmt: skip
            assert r.status_code == 200, r.text
            return {k: r.json()[k] for k in ("text", "words")}

        assert words(production["tiny-qwen3-asr"], "qwen3-asr-0.6b") == words(
            fleet.workers["tiny-qwen3-asr"], "tiny-qwen3-asr"
        )
    finally:
        for w in production.values():
            w.stop()


def utterance(
    ws: Any,
    pieces: list[str],
    pause: float,
    meanwhile: Callable[[], None] | None = None,
    **options: Any,
) -> tuple[bytes, float | None, float]:
    """An utterance on a ``/v1/audio/speech/stream`` socket, its text sent in ``pieces`` with
    ``pause`` s between them (``meanwhile`` run once the first is sent; ``options`` added to
    ``speech.create``): (audio, when its first audio came, when the last piece went), times
    from the start."""
    t0 = time.monotonic()
    create = {"type": "speech.create", "voice": "vivian", "seed": 5, "input": pieces[0], **options}
    ws.send(json.dumps(create))
    assert json.loads(ws.recv(timeout=60))["type"] == "speech.created"
    if meanwhile is not None:
        meanwhile()
    audio, first, sent_last = bytearray(), None, time.monotonic() - t0
    for piece in pieces[1:]:
        deadline = time.monotonic() + pause
        while (left := deadline - time.monotonic()) > 0:  # read what comes meanwhile
            try:
                event = json.loads(ws.recv(timeout=left))
            except TimeoutError:
                break
            assert event["type"] == "speech.audio.delta", event
            first = first if first is not None else time.monotonic() - t0
            audio += base64.b64decode(event["audio"])
        ws.send(json.dumps({"type": "input_text.delta", "delta": piece}))
        sent_last = time.monotonic() - t0
    ws.send(json.dumps({"type": "input_text.done"}))
    while (event := json.loads(ws.recv(timeout=120)))["type"] != "speech.audio.done":
        assert event["type"] == "speech.audio.delta", event
        first = first if first is not None else time.monotonic() - t0
        audio += base64.b64decode(event["audio"])
    return bytes(audio), first, sent_last


def test_text_streamed_into_speech_through_the_router(fleet: FamilyFleet) -> None:
    """``/v1/audio/speech/stream`` on Qwen3-TTS through the router: words sent one by one with
    pauses are spoken as they come (the first audio before the last word was sent), the audio
    equals the same text sent at once, and mistakes are error events on an open socket."""
    from websockets.sync.client import connect

    url = fleet.router.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    # (short: the talker reads a token a frame, and the tiny spec stops at FRAMES frames)
    words = ["Hi", " yo", " ok."]

    with connect(url + "?model=tiny-qwen3-tts", open_timeout=30) as ws:
        # (pauses long enough for a first packet on two busy cores: the talker waits for the
        # second piece to know the first word is complete)
        streamed, first, last = utterance(ws, words, pause=1.0)
        assert first is not None and first < last, (first, last)
        at_once, _, _ = utterance(ws, ["".join(words)], pause=0)
        assert streamed and streamed == at_once
        # telephony audio on the socket: the same speech as G.711 mu-law at 8 kHz
        mulaw, _, _ = utterance(ws, ["".join(words)], pause=0, response_format="mulaw")
        assert len(mulaw) == len(at_once) // 6 and mulaw == _telephone(at_once, "mulaw")
        ws.send(json.dumps({"type": "input_text.delta", "delta": "no utterance"}))
        error = json.loads(ws.recv(timeout=30))
        assert error["error"]["code"] == "invalid_request" and error["error"]["param"] == "type"
        ws.send(json.dumps({"type": "speech.create", "voice": "nobody", "input": "x"}))
        assert json.loads(ws.recv(timeout=30))["error"]["code"] == "voice_not_found"


def test_a_talker_waiting_for_text_lets_the_others_run(fleet: FamilyFleet) -> None:
    """While an utterance waits for its next words, another speech runs beside it (on SGLang
    the waiting request sits out of the running batch, its KV kept): each equals what it
    gives alone."""
    from websockets.sync.client import connect

    sdk = fleet.sdk()

    def speech() -> bytes:
        return sdk.audio.speech.create(
            model="tiny-qwen3-tts", input="Meanwhile, another voice.", voice="ryan",
            response_format="pcm", extra_body={"seed": 9},
        ).content  # fmt: skip

    alone = speech()
    beside: list[bytes] = []
    url = fleet.router.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    words = ["Hi there", " my", " friend."]  # (the talker reads "Hi", then waits)
    with connect(url + "?model=tiny-qwen3-tts", open_timeout=30) as ws:
        held, _, _ = utterance(ws, words, pause=0.5, meanwhile=lambda: beside.append(speech()))
        at_once, _, _ = utterance(ws, ["".join(words)], pause=0)
    assert beside == [alone] and held == at_once
    # a client that leaves while its utterance is held: the talker drops it, the rest go on
    with connect(url + "?model=tiny-qwen3-tts", open_timeout=30) as ws:
        ws.send(json.dumps({"type": "speech.create", "voice": "vivian", "input": words[0]}))
        assert json.loads(ws.recv(timeout=60))["type"] == "speech.created"
        beside.append(speech())
    assert beside[-1] == alone and speech() == alone


def test_a_full_talker_is_refused_at_admission_through_the_router(fleet: FamilyFleet) -> None:
    """The spec's running and queued limits (here 1 + 0 on the talker): a second speech while
    a streamed one holds the talker is refused by its worker with 503 ``overloaded`` before any
    audio, and the router, with no other worker left, answers 429 (the SDK's RateLimitError)
    with Retry-After; the worker is not blamed, and once the first ends the next one speaks."""
    from websockets.sync.client import connect

    worker = WorkerProcess(
        "--spec", WORKERS["tiny-qwen3-tts"][0], "--gpus", "cpu", "--fleet", FLEET + "-limited",
        "--tts_engine.engine.max_new_tokens", str(MAX_NEW),
        "--tts_engine.engine.max_running_requests", "1",
        "--tts_engine.engine.max_queued_requests", "0",
        "--cache-dir", str(fleet.caches["tiny-qwen3-tts"]), redis_url=fleet.redis_url,
    )  # fmt: skip
    router = None
    try:
        router = Router("--fleet", FLEET + "-limited", "--redis-url", fleet.redis_url)
        worker.wait_ready(timeout=600)
        wait_for(lambda: router.ready()["routable_workers"] == 1, timeout=30)
        sdk = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
        body = {"model": "tiny-qwen3-tts", "input": "Hi.", "voice": "vivian",
                "response_format": "pcm", "temperature": 0}  # fmt: skip

        def speak() -> bytes:
            return sdk.audio.speech.create(
                model="tiny-qwen3-tts", input="Hi.", voice="vivian", response_format="pcm",
                extra_body={"temperature": 0},
            ).content  # fmt: skip

        url = router.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
        with connect(url + "?model=tiny-qwen3-tts", open_timeout=30) as ws:
            create = {"type": "speech.create", "voice": "vivian", "input": "Hello"}
            ws.send(json.dumps(create))  # (its text never ends: it holds the talker)
            assert json.loads(ws.recv(timeout=60))["type"] == "speech.created"
            with pytest.raises(openai.RateLimitError) as refused:
                speak()
            assert refused.value.response.headers["retry-after"]
            error = refused.value.response.json()["error"]
            assert error["code"] == "overloaded", error
            direct = httpx.post(worker.url + "/v1/audio/speech", json=body, timeout=30)
            assert direct.status_code == 503, direct.text
            assert "stage tts_engine is full" in direct.json()["error"]["message"]
            ws.send(json.dumps({"type": "input_text.done"}))
            while json.loads(ws.recv(timeout=120))["type"] != "speech.audio.done":
                pass
        wait_for(lambda: httpx.get(worker.url + "/load").json()["in_flight"] == 0, timeout=30)
        assert len(speak()) == FRAMES * 1920 * 2
        health = router.diagnostics()["workers"][0]["health"]
        assert health["breaker"] == "closed" and not health["consecutive_failures"], health
    finally:
        if router is not None:
            router.stop()
        worker.stop()


def test_text_streamed_into_a_realtime_tts_session(fleet: FamilyFleet) -> None:
    """A realtime session on Qwen3-TTS through the router: ``input_text_buffer.append`` starts
    a response that speaks the text as it is written (the first audio before the last piece,
    each piece in the transcript as the talker gets it), ``input_text_buffer.commit`` ends it;
    the audio equals the speech stream's for the same text (greedy). Mistakes are error events
    on an open session."""
    from websockets.sync.client import connect

    base = fleet.router.url.replace("http://", "ws://")
    words = ["Hi", " yo", " ok."]

    def recv(ws, timeout: float = 60) -> dict:
        return json.loads(ws.recv(timeout=timeout))

    with connect(base + "/v1/realtime?model=tiny-qwen3-tts", open_timeout=30) as ws:
        assert recv(ws)["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update",
                            "session": {"type": "realtime", "temperature": 0}}))  # fmt: skip
        assert recv(ws)["type"] == "session.updated"
        ws.send(json.dumps({"type": "input_text_buffer.commit"}))  # nothing streams yet
        error = recv(ws)
        assert error["type"] == "error" and error["error"]["param"] == "type", error
        t0 = time.monotonic()
        seen: list[dict] = []
        audio, first, sent_last = bytearray(), None, 0.0

        def take(event: dict) -> None:
            nonlocal first
            seen.append(event)
            if event["type"] == "response.output_audio.delta":
                first = first if first is not None else time.monotonic() - t0
                audio.extend(base64.b64decode(event["delta"]))

        ws.send(json.dumps({"type": "input_text_buffer.append", "delta": words[0]}))
        for piece in words[1:]:
            deadline = time.monotonic() + 1.0  # (as in the speech stream test)
            while (left := deadline - time.monotonic()) > 0:
                try:
                    take(recv(ws, left))
                except TimeoutError:
                    break
            ws.send(json.dumps({"type": "input_text_buffer.append", "delta": piece}))
            sent_last = time.monotonic() - t0
        ws.send(json.dumps({"type": "response.create"}))  # one is in flight: refused
        ws.send(json.dumps({"type": "input_text_buffer.commit"}))
        while not seen or seen[-1]["type"] != "response.done":
            take(recv(ws, 120))
    kinds = [e["type"] for e in seen]
    assert first is not None and first < sent_last, (first, sent_last)
    assert kinds[0] == "response.created" and "input_text_buffer.committed" in kinds
    assert [e["error"]["code"] for e in seen if e["type"] == "error"] == [
        "conversation_already_has_active_response"
    ]
    transcript = [e["delta"] for e in seen if e["type"] == "response.output_audio_transcript.delta"]
    assert transcript == words
    done = seen[-1]["response"]
    # (greedy, the tiny talker's random weights speak up to the spec's frame limit)
    assert (done["status"], done["status_details"]["reason"]) == ("incomplete", "max_output_tokens")
    assert done["output"][0]["content"][0]["transcript"] == "".join(words)

    # the same text through the speech stream, at once and greedy: the same audio
    with connect(base + "/v1/audio/speech/stream?model=tiny-qwen3-tts", open_timeout=30) as ws:
        create = {"type": "speech.create", "voice": "vivian", "temperature": 0,
                  "input": "".join(words)}  # fmt: skip
        ws.send(json.dumps(create))
        assert recv(ws)["type"] == "speech.created"
        ws.send(json.dumps({"type": "input_text.done"}))
        streamed = bytearray()
        while (event := recv(ws, 120))["type"] != "speech.audio.done":
            streamed.extend(base64.b64decode(event["audio"]))
    assert audio and bytes(audio) == bytes(streamed)


def test_a_transcription_session_on_qwen3_asr_through_the_router(fleet: FamilyFleet) -> None:
    """OpenAI's transcription session (what LiveKit's and Pipecat's realtime STT open) on the
    Qwen3-ASR worker, through the router with the SDK: the router sends
    ``?intent=transcription`` to a worker that transcribes; each segment, committed in turn, is
    transcribed with the session's language (an ISO code) and, as its context, the session's
    prompt then the earlier segments' text: the input tokens of ``/v1/audio/transcriptions``
    with that context. Every event passes the SDK's models in strict mode."""
    from tests.realtime_client import recv_strict, sdk_client, stream_audio
    from tests.spoken import speech_pcm

    segments = [speech_pcm(0.6, seed=3), speech_pcm(0.9, seed=4)]

    async def run() -> list[tuple[str, int]]:
        client = sdk_client(fleet.router.url, "unused")
        async with client.realtime.connect(
            model="tiny-qwen3-asr", extra_query={"intent": "transcription"}
        ) as conn:
            created = await recv_strict(conn)
            assert created.type == "session.created" and created.session.type == "transcription"
            transcription = {"model": "gpt-4o-transcribe", "language": "en", "prompt": "Oslo."}
            await conn.session.update(session={"type": "transcription", "audio": {"input": {
                "transcription": transcription, "turn_detection": None}}})  # fmt: skip
            assert (await recv_strict(conn)).type == "session.updated"
            for pcm in segments:
                await stream_audio(conn, pcm, paced=False)
                await conn.input_audio_buffer.commit()
            got: list[tuple[str, int]] = []
            while len(got) < len(segments):
                event = await recv_strict(conn)
                assert event.type != "error", event
                if event.type == "conversation.item.input_audio_transcription.completed":
                    got.append((event.transcript, event.usage.input_tokens))
            return got

    got = asyncio.run(run())
    sdk = fleet.sdk()
    earlier: list[str] = []
    for pcm, (transcript, tokens) in zip(segments, got, strict=True):
        clip = io.BytesIO()
        sf.write(clip, np.frombuffer(pcm, dtype="<i2"), 24_000, format="WAV", subtype="PCM_16")
        prompt = "\n".join(p for p in ["Oslo.", " ".join(t.strip() for t in earlier)] if p)
        rest = sdk.audio.transcriptions.create(
            model="tiny-qwen3-asr", file=("clip.wav", clip.getvalue()), prompt=prompt,
            language="en",
        )  # fmt: skip
        assert rest.usage.input_tokens == tokens, (prompt, rest.usage, tokens)
        earlier.append(transcript)


# -- the voice-agent frameworks' own clients, unchanged (issue 47) ------------------------------


def test_livekit_agents_tts_and_stt_through_the_router(fleet: FamilyFleet) -> None:
    """LiveKit Agents' OpenAI plugin pointed at the router (``base_url``, the model, an OpenAI
    voice name): TTS in its default mp3 over SSE and in pcm, the same speech; STT over REST
    (its default language, ``en``) and as a realtime transcription session (``use_realtime``:
    ``?intent=transcription``, server VAD, 50 ms appends), the same text."""
    from livekit import rtc
    from livekit.agents import stt, utils
    from livekit.plugins import openai as lk

    from tests.spoken import pcm_frames, speech_pcm

    base_url = fleet.router.url + "/v1"
    speech = speech_pcm(1.5, seed=7)

    async def run() -> tuple[dict[str, int], str, list[tuple[stt.SpeechEventType, str]]]:
        samples = {}
        for fmt in ("mp3", "pcm"):
            tts = lk.TTS(model="tiny-qwen3-tts", voice="alloy", base_url=base_url,
                         api_key="unused", response_format=fmt)  # fmt: skip
            async with tts.synthesize("Hello from LiveKit.") as stream:
                samples[fmt] = sum([ev.frame.samples_per_channel async for ev in stream])
            await tts.aclose()
        utils.http_context._new_session_ctx()
        try:
            rest = lk.STT(model="tiny-qwen3-asr", base_url=base_url, api_key="unused",
                          use_realtime=False)  # fmt: skip
            heard = await rest.recognize(rtc.AudioFrame(speech, 24_000, 1, len(speech) // 2))
            live = lk.STT(model="tiny-qwen3-asr", base_url=base_url, api_key="unused",
                          use_realtime=True)  # fmt: skip
            stream = live.stream()
            silence = bytes(2 * 24_000)

            async def microphone() -> None:  # 50 ms frames, as they play
                for piece in (silence, speech, silence, silence):
                    for frame in pcm_frames(
                        piece, 50, lambda b: rtc.AudioFrame(b, 24_000, 1, len(b) // 2)
                    ):
                        stream.push_frame(frame)
                        await asyncio.sleep(0.05)
                stream.end_input()

            async def heard_events() -> list:  # up to the turn's transcript, as an agent reads
                seen = []
                async for e in stream:
                    seen.append((e.type, e.alternatives[0].text if e.alternatives else ""))
                    if e.type == stt.SpeechEventType.FINAL_TRANSCRIPT:
                        return seen
                return seen

            _, events = await asyncio.wait_for(
                asyncio.gather(microphone(), heard_events()), timeout=120
            )
            await stream.aclose()
            await rest.aclose()
            await live.aclose()
        finally:
            await utils.http_context._close_http_ctx()
        return samples, heard.alternatives[0].text, events

    samples, rest_text, events = asyncio.run(run())
    # 15 frames of 1920 samples: LiveKit's emitter pads its last 10 ms frame, and mp3 decodes
    # with its encoder's padding (under one frame)
    assert 0 <= samples["pcm"] - FRAMES * 1920 <= 240 and 0 <= samples["mp3"] - FRAMES * 1920 < 1920
    kinds = [kind for kind, _ in events]
    assert (
        stt.SpeechEventType.START_OF_SPEECH in kinds and stt.SpeechEventType.END_OF_SPEECH in kinds
    )
    finals = [text for kind, text in events if kind == stt.SpeechEventType.FINAL_TRANSCRIPT]
    assert len(finals) == 1
    clip = io.BytesIO()
    sf.write(clip, np.frombuffer(speech, dtype="<i2"), 24_000, format="WAV", subtype="PCM_16")
    sdk = fleet.sdk().audio.transcriptions.create(
        model="tiny-qwen3-asr", file=("a.wav", clip.getvalue()), language="en"
    )
    assert rest_text == sdk.text  # what the SDK hears in the same audio


def test_pipecat_services_through_the_router(fleet: FamilyFleet) -> None:
    """Pipecat's OpenAI services pointed at the router, run by Pipecat's own test pipeline
    (``pipecat.tests.utils.run_test``): TTS (raw pcm, a voice among OpenAI's 13: Pipecat takes
    no other), STT over REST (segmented by the VAD frames, language ``en``) and realtime STT
    (``?intent=transcription`` with no model in the URL, ``turn_detection: null``: the local
    VAD's stop commits): speech out, a transcript in each."""
    from loguru import logger
    from pipecat.frames.frames import (
        ErrorFrame,
        InputAudioRawFrame,
        InterimTranscriptionFrame,
        TranscriptionFrame,
        TTSAudioRawFrame,
        TTSSpeakFrame,
        VADUserStartedSpeakingFrame,
        VADUserStoppedSpeakingFrame,
    )
    from pipecat.services.openai.stt import OpenAIRealtimeSTTService, OpenAISTTService
    from pipecat.services.openai.tts import OpenAITTSService
    from pipecat.tests.utils import SleepFrame, run_test

    from tests.spoken import pcm_frames, speech_pcm

    logger.remove()  # (Pipecat logs every frame at DEBUG)
    base_url = fleet.router.url + "/v1"
    turn = [
        VADUserStartedSpeakingFrame(),
        *pcm_frames(speech_pcm(1.5, seed=9), 20, lambda b: InputAudioRawFrame(b, 24_000, 1)),
        VADUserStoppedSpeakingFrame(),
        SleepFrame(5),
    ]

    async def run() -> tuple[list, list, list]:
        tts = OpenAITTSService(api_key="unused", base_url=base_url, settings=OpenAITTSService
                               .Settings(model="tiny-qwen3-tts", voice="alloy"))  # fmt: skip
        spoken, _ = await run_test(tts, frames_to_send=[TTSSpeakFrame("Hello from Pipecat.")])
        asr = "tiny-qwen3-asr"
        rest = OpenAISTTService(api_key="unused", base_url=base_url,
                                settings=OpenAISTTService.Settings(model=asr))  # fmt: skip
        heard, _ = await run_test(rest, frames_to_send=turn)
        live = OpenAIRealtimeSTTService(
            api_key="unused", base_url=base_url.replace("http", "ws", 1) + "/realtime",
            settings=OpenAIRealtimeSTTService.Settings(model=asr),
        )  # fmt: skip
        streamed, _ = await run_test(live, frames_to_send=[SleepFrame(1), *turn])
        return list(spoken), list(heard), list(streamed)

    spoken, heard, streamed = asyncio.run(run())
    for frames in (spoken, heard, streamed):
        assert not [f for f in frames if isinstance(f, ErrorFrame)], frames
    audio = b"".join(f.audio for f in spoken if isinstance(f, TTSAudioRawFrame))
    assert len(audio) == FRAMES * 1920 * 2
    assert len([f for f in heard if isinstance(f, TranscriptionFrame)]) == 1
    finals = [f for f in streamed if isinstance(f, TranscriptionFrame)]
    interims = [f for f in streamed if isinstance(f, InterimTranscriptionFrame)]
    assert len(finals) == 1 and interims and interims[-1].text == finals[0].text


def test_baseten_qwen3_tts_speaks_vllm_omnis_dialect_through_the_router(
    fleet: FamilyFleet,
) -> None:
    """LiveKit's ``livekit-plugins-baseten`` ``Qwen3TTS``, unchanged, pointed at the router's
    speech socket: vLLM-Omni's protocol (``session.config``, ``input.text``, ``input.done``;
    ``audio.start``, binary PCM, ``audio.done``, ``session.done``) with a voice uploaded to the
    fleet and cloned by Qwen3-TTS Base. Two turns on its one warm socket (the config sent once),
    each the audio our own dialect makes of the same text; what the worker cannot honour is an
    error naming the field."""
    from livekit.agents import utils
    from livekit.plugins import baseten
    from websockets.sync.client import connect

    sdk = fleet.sdk()
    consent = sdk.audio.voice_consents.create(
        name="lk", language="en", recording=("c.wav", tone_wav(1.0), "audio/wav")
    ).id
    sdk.audio.voices.create(name="lk-clone", audio_sample=("v.wav", tone_wav(1.0, freq=220.0),
                            "audio/wav"), consent=consent)  # fmt: skip
    url = fleet.router.url.replace("http://", "ws://") + "/v1/audio/speech/stream"
    base = url + "?model=tiny-qwen3-tts-base"
    texts = ["Hi there.", "Bye now."]

    async def turns() -> list[bytes]:
        utils.http_context._new_session_ctx()
        tts = baseten.TTS(model="qwen3-tts", model_endpoint=base, api_key="unused",
                          voice="lk-clone", extra_config={"temperature": 0})  # fmt: skip
        heard = []
        try:
            for text in texts:
                stream = tts.stream()
                stream.push_text(text)
                stream.end_input()
                heard.append(b"".join([bytes(ev.frame.data) async for ev in stream]))
                await stream.aclose()
        finally:
            await tts.aclose()
            await utils.http_context._close_http_ctx()
        return heard

    heard = asyncio.run(turns())
    with connect(base, open_timeout=30) as ws:  # our own dialect, the same texts
        ours = [utterance(ws, [t], pause=0, voice="lk-clone", temperature=0)[0] for t in texts]
    assert heard == ours and all(len(a) == FRAMES * 1920 * 2 for a in ours)
    with connect(url + "?model=tiny-qwen3-tts", open_timeout=30) as ws:
        config = {"type": "session.config", "voice": "vivian", "task_type": "Base"}
        wrongs = [
            ({}, "task_type"),
            ({"task_type": None, "ref_audio": "x"}, "ref_audio"),
            ({"task_type": None, "split_granularity": "sentence"}, "split_granularity"),
        ]
        for wrong, param in wrongs:
            ws.send(json.dumps({**config, **wrong}))
            error = json.loads(ws.recv(timeout=30))
            assert error["type"] == "error" and error["param"] == param, error
        ws.send(json.dumps({"type": "input.done"}))  # (no config took yet)
        assert json.loads(ws.recv(timeout=30))["type"] == "error"
        ws.send(json.dumps({**config, "task_type": "CustomVoice", "response_format": "pcm",
                            "stream_audio": True, "temperature": 0}))  # fmt: skip
        ws.send(json.dumps({"type": "input.done"}))  # an empty flush (LiveKit's keepalive)
        assert json.loads(ws.recv(timeout=30)) == {"type": "session.done", "total_sentences": 0}
        ws.send(json.dumps({"type": "input.text", "text": "Hi yo ok."}))
        ws.send(json.dumps({"type": "input.done"}))
        start = json.loads(ws.recv(timeout=60))
        assert start["type"] == "audio.start" and start["sample_rate"] == 24_000
        audio = bytearray()
        while isinstance(frame := ws.recv(timeout=60), bytes):
            audio += frame
        done = json.loads(frame)
        assert (
            done["type"] == "audio.done" and done["total_bytes"] == len(audio) and not done["error"]
        )
        assert json.loads(ws.recv(timeout=30))["type"] == "session.done"
        ws.send(json.dumps({"type": "voice.list"}))
        assert json.loads(ws.recv(timeout=30))["param"] == "type"
    with connect(url + "?model=tiny-qwen3-tts", open_timeout=30) as ws:
        assert bytes(audio) == utterance(ws, ["Hi yo ok."], pause=0, temperature=0)[0]
