"""Qwen3-TTS served by omni-worker equals the official ``qwen-tts`` package.

Tiny checkpoints are written by the official classes (their ``save_pretrained``) in the
reference venv (``scripts/reference/venv.sh``: transformers 4.57 + qwen-tts); the package then
generates greedily (``do_sample=False``, ``subtalker_dosample=False``) with its own
``Qwen3TTSModel``. omni-fleet loads the same directories with its own classes:

* in process, its talker on SGLang (``talker_sglang.generate``, one engine at a time) must
  produce exactly the package's codes for every request (all of a variant's requests stepped as
  one batch), and the speech tokenizer's decoder the package's waveform;
* through a real worker (HTTP, stage process), ``/v1/audio/speech`` must return that waveform
  (within two int16 steps), for built-in speakers (CustomVoice) and for an uploaded voice
  cloned on Base (speaker encoder x-vector, reference codes from the Mimi encoder, ICL prompt).

Two sizes per variant (talker width and depth, text width, code-predictor projection, codec).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.models import qwen3_tts_reference as ref
from tests.worker_procs import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MAX_NEW = 10  # talker steps: 9 frames (the last first code never gets its frame)
CV = ["tiny-qwen3-tts-custom-voice", "tiny-qwen3-tts-custom-voice-wide"]
BASE = ["tiny-qwen3-tts-base", "tiny-qwen3-tts-base-wide"]
VD = "tiny-qwen3-tts-voice-design"
VD_REQUESTS = [
    {"text": "Hello there, world.", "instruct": "A deep, calm voice.", "language": "English"},
    {"text": "Streaming text input.", "instruct": "Bright and quick.", "language": "Auto",
     "non_streaming_mode": False},
]  # fmt: skip
CV_REQUESTS = [
    {"text": "Hello there, world.", "speaker": "vivian", "language": "English"},
    # a dialect speaker with language auto; the instruction (the 0.6B drops it, as the package)
    {"text": "Short one", "speaker": "eric", "language": "Auto", "instruct": "Speak slowly."},
    {"text": "Streaming text input.", "speaker": "ryan", "language": "German",
     "non_streaming_mode": False},
]  # fmt: skip
# a reply past the vocoder's first 300-frame block (the package decodes 300 frames at a time,
# 25 before each): the streamed waveform must be the package's decode there too
LONG_NEW = 330
LONG_REQUEST = {"text": "A reply long enough to span two vocoder blocks.", "speaker": "vivian",
                "language": "English", "max_new_tokens": LONG_NEW}  # fmt: skip
CLONE_REQUESTS = [
    {"text": "Cloned words here.", "language": "English", "ref_text": "A reference."},
    {"text": "Only the x vector.", "language": "Auto", "x_vector_only": True},
    {"text": "Non streaming clone.", "language": "Chinese",
     "ref_text": "A reference text longer than its codes are.", "non_streaming_mode": True},
]  # fmt: skip


@pytest.fixture(scope="module")
def official(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("qwen3-tts-official")
    checkpoints = ref.official_checkpoints([*CV, *BASE, VD], tmp)
    _, stored = ref.reference_audio()
    np.save(tmp / "ref.npy", stored)
    runs = {name: [dict(r, max_new_tokens=MAX_NEW) for r in CV_REQUESTS] for name in CV}
    runs[CV[1]].append(LONG_REQUEST)  # result index len(CV_REQUESTS)
    clone = {"ref_audio": str(tmp / "ref.npy"), "ref_sr": 24_000, "max_new_tokens": MAX_NEW}
    runs |= {name: [dict(r, **clone) for r in CLONE_REQUESTS] for name in BASE}
    runs[VD] = [dict(r, design=True, max_new_tokens=MAX_NEW) for r in VD_REQUESTS]
    results = ref.official_generate(runs, checkpoints, tmp)
    return {"checkpoints": checkpoints, "results": results, "stored": stored, "tmp": tmp}


@contextmanager
def _ours(checkpoint: Path, spec_name: str) -> Iterator[tuple]:
    """The talker of ``checkpoint`` on SGLang in this process (the tts_engine stage of
    ``spec_name``, loaded, closed at the end: one SGLang engine at a time), the speech
    tokenizer, the greedy sampling the official runs used."""
    import torch
    import yaml

    from planner.spec import ModelSpec
    from worker.contract.sampling import Sampling
    from worker.contract.stage_context import StageContext
    from worker.layers.generation_config import read_generation_config
    from worker.layers.module_weights import load_into
    from worker.models.qwen3_tts.codec import SpeechTokenizer, mimi_name
    from worker.models.qwen3_tts.talker import TalkerExecutor, checkpoint_sampling

    path = ref.REPO / "configs" / "models" / f"{spec_name}.yaml"
    spec = ModelSpec.model_validate(yaml.safe_load(path.read_text()))
    stage = spec.stages["tts_engine"]
    talker = TalkerExecutor(StageContext("tts_engine", spec, stage, checkpoint, "cpu", 8))
    try:
        talker.load()
        cfg = json.loads((checkpoint / "speech_tokenizer" / "config.json").read_text())
        st = SpeechTokenizer(cfg, with_encoder=True)
        load_into(st.decoder, checkpoint / "speech_tokenizer", prefix="decoder.")
        load_into(st.encoder, checkpoint / "speech_tokenizer", prefix="encoder.", rename=mimi_name)
        # greedy, as the official runs compared here decode (with the checkpoint's penalty)
        greedy = checkpoint_sampling(read_generation_config(checkpoint)).with_request(
            Sampling(temperature=0)
        )
        yield torch, talker, st, greedy
    finally:
        talker.close()


@pytest.mark.parametrize("name", CV)
def test_custom_voice_codes_and_waveform_equal_official(name: str, official: dict) -> None:
    from worker.models.qwen3_tts.talker import generate

    res = official["results"][name]
    batch = [
        {
            "text": r["text"],
            "speaker": r["speaker"],
            "language": r["language"],
            "instruct": r.get("instruct"),
            "non_streaming": r.get("non_streaming_mode", True),
        }
        for r in CV_REQUESTS
    ]
    with _ours(official["checkpoints"][name], "tiny-qwen3-tts") as (_, talker, st, greedy):
        codes = generate(talker, batch, MAX_NEW, greedy)
        for i, c in enumerate(codes):
            assert c.shape[0] == MAX_NEW - 1
            np.testing.assert_array_equal(c.numpy(), res[f"{i}.codes"], err_msg=f"request {i}")
            wav = st.decode(c).numpy()
            np.testing.assert_allclose(wav, res[f"{i}.wav"], atol=1e-5, err_msg=f"request {i}")


def test_voice_design_codes_and_waveform_equal_official(official: dict) -> None:
    """VoiceDesign (generate_voice_design): no speaker, the voice described by the instruct."""
    from worker.models.qwen3_tts.talker import generate

    res = official["results"][VD]
    batch = [
        {
            "text": r["text"],
            "language": r["language"],
            "instruct": r["instruct"],
            "non_streaming": r.get("non_streaming_mode", True),
        }
        for r in VD_REQUESTS
    ]
    spec = "tiny-qwen3-tts-voice-design"
    with _ours(official["checkpoints"][VD], spec) as (_, talker, st, greedy):
        codes = generate(talker, batch, MAX_NEW, greedy)
        for i, c in enumerate(codes):
            np.testing.assert_array_equal(c.numpy(), res[f"{i}.codes"], err_msg=f"request {i}")
            wav = st.decode(c).numpy()
            np.testing.assert_allclose(wav, res[f"{i}.wav"], atol=1e-5, err_msg=f"request {i}")


def test_voice_design_through_a_router_equals_official(official: dict, redis_url: str) -> None:
    """The VoiceDesign worker behind a real router, with the SDK: the voice is "designed", the
    description is ``instructions``; the router sends the model's requests only to the worker
    that serves it, and a speaker's name is refused."""
    import openai

    from tests.fakes.procs import Router, wait_for

    tmp = official["tmp"]
    spec = ref.spec_for(VD, official["checkpoints"][VD], tmp, MAX_NEW)
    fleet = "voice-design"
    worker = WorkerProcess(
        "--spec", str(spec), "--gpus", "cpu", "--cache-dir", str(tmp), "--fleet", fleet,
        redis_url=redis_url,
    )  # fmt: skip
    router = None
    try:
        router = Router("--fleet", fleet, "--redis-url", redis_url)
        worker.wait_ready(timeout=300)
        wait_for(lambda: router.ready()["routable_workers"] == 1, timeout=30)
        sdk = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
        model = sdk.models.retrieve(VD).model_dump()
        assert model["voices"] == ["designed"], model
        r = VD_REQUESTS[0]
        pcm = sdk.audio.speech.create(
            model=VD, input=r["text"], voice="designed", instructions=r["instruct"],
            response_format="pcm", extra_body={"temperature": 0, "language": r["language"]},
        ).content  # fmt: skip
        ref.assert_same_speech(
            np.frombuffer(pcm, dtype="<i2"), official["results"][VD]["0.wav"], "voice design"
        )
        with pytest.raises(openai.BadRequestError) as err:
            sdk.audio.speech.create(model=VD, input="x", voice="vivian")
        assert err.value.code == "voice_not_found"
        # OpenAI's voice designed from words: stored in the fleet, then spoken as the designed
        # voice with its prompt as the description (JSON or multipart, as OpenAI takes it)
        made = sdk.audio.voices.create(name="calm", type="prompt", prompt=r["instruct"],
                                       extra_query={"model": VD})  # fmt: skip
        assert (made.object, made.type, made.prompt) == ("audio.voice", "prompt", r["instruct"])
        voices = httpx.get(router.url + "/v1/audio/voices", timeout=30).json()["data"]
        listed = {v["id"]: v for v in voices}
        assert listed["calm"]["type"] == "prompt" and listed["calm"]["prompt"] == r["instruct"]
        pcm = sdk.audio.speech.create(
            model=VD, input=r["text"], voice="calm", response_format="pcm",
            extra_body={"temperature": 0, "language": r["language"]},
        ).content  # fmt: skip
        ref.assert_same_speech(
            np.frombuffer(pcm, dtype="<i2"), official["results"][VD]["0.wav"], "prompt voice"
        )
        as_json = httpx.post(router.url + "/v1/audio/voices", json={
            "name": "bright", "type": "prompt", "prompt": "Bright and quick.",
        }, timeout=30)  # fmt: skip
        assert as_json.status_code == 200 and as_json.json()["prompt"] == "Bright and quick."
        for bad, param in (({"prompt": "  "}, "prompt"), ({"script_hint": "Hi."}, "script_hint"),
                           ({"model": "gpt-voice"}, "model"),
                           ({"promt": "Deep."}, "promt")):  # fmt: skip
            body = {"name": "x", "type": "prompt", "prompt": "Deep.", **bad}
            refused = httpx.post(router.url + "/v1/audio/voices", json=body, timeout=30)
            assert refused.status_code == 400 and refused.json()["error"]["param"] == param
    finally:
        if router is not None:
            router.stop()
        worker.stop()


@pytest.mark.parametrize("name", BASE)
def test_voice_clone_codes_and_waveform_equal_official(name: str, official: dict) -> None:
    from worker.models.qwen3_tts.prompt import speaker_embedding
    from worker.models.qwen3_tts.talker import generate

    res = official["results"][name]
    checkpoint = official["checkpoints"][name]
    with _ours(checkpoint, "tiny-qwen3-tts-base") as (torch, talker, st, greedy):
        wav_ref = torch.from_numpy(official["stored"])
        spk = speaker_embedding(talker.model, wav_ref)
        ref_codes = st.encode(wav_ref)
        for i, r in enumerate(CLONE_REQUESTS):
            np.testing.assert_allclose(spk.numpy(), res[f"{i}.spk"], atol=1e-5)
            icl = not r.get("x_vector_only")
            if icl:
                np.testing.assert_array_equal(ref_codes.numpy(), res[f"{i}.ref_code"])
            kw = {
                "text": r["text"],
                "language": r["language"],
                "speaker_embedding": spk,
                "ref_text": r.get("ref_text") if icl else None,
                "ref_codes": ref_codes if icl else None,
                "non_streaming": r.get("non_streaming_mode", False),
            }
            (codes,) = generate(talker, [kw], MAX_NEW, greedy)
            np.testing.assert_array_equal(codes.numpy(), res[f"{i}.codes"], err_msg=f"req {i}")
            full = torch.cat([ref_codes, codes]) if icl else codes
            wav = st.decode(full)
            if icl:
                wav = wav[ref_codes.shape[0] * 1920 :]
            np.testing.assert_allclose(wav.numpy(), res[f"{i}.wav"], atol=1e-5, err_msg=f"req {i}")


def _speech(worker: WorkerProcess, model: str, body: dict) -> np.ndarray:
    """The worker's greedy speech (``temperature: 0``, as the official runs compared)."""
    body = {"model": model, "response_format": "pcm", "temperature": 0, **body}
    r = httpx.post(worker.url + "/v1/audio/speech", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return np.frombuffer(r.content, dtype="<i2")


# Through the worker: one size per variant (both sizes are compared in process above).
@pytest.mark.parametrize("name", CV[1:])
def test_worker_speech_equals_official(name: str, official: dict) -> None:
    tmp = official["tmp"]
    spec = ref.spec_for("tiny-qwen3-tts", official["checkpoints"][name], tmp, MAX_NEW)
    res = official["results"][name]
    worker = WorkerProcess("--spec", str(spec), "--gpus", "cpu", "--cache-dir", str(tmp))
    try:
        worker.wait_ready(timeout=300)
        for i, r in enumerate(CV_REQUESTS[:2]):  # the API sends the text at once
            body = {"input": r["text"], "voice": r["speaker"], "language": r["language"]}
            if r.get("instruct"):
                body["instructions"] = r["instruct"]
            ref.assert_same_speech(
                _speech(worker, "tiny-qwen3-tts", body), res[f"{i}.wav"], f"request {i}"
            )
    finally:
        worker.stop()


def test_worker_speech_spanning_vocoder_blocks_equals_official(official: dict) -> None:
    """329 frames: the first block whole, then 29 frames decoded with 25 before them."""
    tmp = official["tmp"]
    spec = ref.spec_for("tiny-qwen3-tts", official["checkpoints"][CV[1]], tmp, LONG_NEW)
    wav = official["results"][CV[1]][f"{len(CV_REQUESTS)}.wav"]
    assert wav.shape[0] == (LONG_NEW - 1) * 1920
    worker = WorkerProcess("--spec", str(spec), "--gpus", "cpu", "--cache-dir", str(tmp))
    try:
        worker.wait_ready(timeout=300)
        body = {"input": LONG_REQUEST["text"], "voice": "vivian", "language": "English"}
        ref.assert_same_speech(
            _speech(worker, "tiny-qwen3-tts", body), wav, "a reply of two blocks"
        )
    finally:
        worker.stop()


@pytest.mark.parametrize("name", BASE[1:])
def test_worker_cloned_voice_equals_official(name: str, official: dict, redis_url: str) -> None:
    tmp = official["tmp"]
    spec = ref.spec_for("tiny-qwen3-tts-base", official["checkpoints"][name], tmp, MAX_NEW)
    res = official["results"][name]
    data, _ = ref.reference_audio()
    worker = WorkerProcess(
        "--spec", str(spec), "--gpus", "cpu", "--cache-dir", str(tmp), redis_url=redis_url
    )
    try:
        worker.wait_ready(timeout=300)
        for voice, text in (("ref-icl", CLONE_REQUESTS[0]["ref_text"]), ("ref-xvec", "")):
            fields = {"name": voice, **({"text": text} if text else {})}
            up = httpx.post(
                worker.url + "/v1/audio/voices",
                data=fields,
                files={"file": ("ref.wav", data, "audio/wav")},
                timeout=60,
            )
            assert up.status_code == 200, up.text
        for i, voice in ((0, "ref-icl"), (1, "ref-xvec")):
            r = CLONE_REQUESTS[i]
            body = {"input": r["text"], "voice": voice, "language": r["language"]}
            ref.assert_same_speech(
                _speech(worker, "tiny-qwen3-tts-base", body), res[f"{i}.wav"], voice
            )
    finally:
        worker.stop()
