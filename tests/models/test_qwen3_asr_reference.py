"""Qwen3-ASR served by omni-worker equals the official ``qwen-asr`` package.

Tiny checkpoints are written by the official ``Qwen3ASRForConditionalGeneration`` and
``Qwen3ASRProcessor`` (their ``save_pretrained``, in the reference venv of
``scripts/reference/venv.sh``); the package's ``Qwen3ASRModel.transcribe`` runs greedily on the
same 16 kHz audio, with and without a language hint. omni-fleet's own classes load the same
directories: its processor must build the same prompt token for token, its greedy decode must
produce the same transcript tokens (two sizes: tied and untied embeddings, widths, depths), and
a real worker must answer ``/v1/audio/transcriptions`` with the package's text and language.
Long audio with pauses: the package's cut points (at its real limits, 1200 s and the aligner's
180 s) equal omni-fleet's on 22 minutes of bursts and pauses; with the package's limit lowered
to 12 s, 40 s of such audio is cut, prompted, decoded and merged (text, languages, offsets)
as the package does; 35 s in one clip checks the encoder's 8 s attention blocks.
Word timestamps: omni-fleet's Qwen3-ForcedAligner gives the official ``Qwen3ForcedAligner``'s
words and times on tiny aligner checkpoints of two sizes (English, Chinese, a batch of two
clips), and a worker's ``timestamp_granularities[]=word`` equals ``transcribe(...,
return_time_stamps=True)`` of the package.
Bad input (corrupt, empty or over-long audio, unknown language, unsupported format) is a 400.
"""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.models import qwen3_tts_reference as ref
from tests.worker_procs import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

SCRIPT = ref.REPO / "tests" / "models" / "reference" / "qwen3_asr_official.py"
NAMES = ["tiny-qwen3-asr", "tiny-qwen3-asr-wide"]
MAX_NEW = 12
RATE = 16_000


def _audio(seconds: float, seed: int) -> np.ndarray:
    """A chirp with noise, as the worker decodes it from a 16-bit wav (the same samples)."""
    t = np.arange(int(RATE * seconds)) / RATE
    noise = np.random.default_rng(seed).standard_normal(t.size)
    wav = 0.4 * np.sin(2 * np.pi * (200 + 150 * t) * t) + 0.05 * noise
    return sf.read(io.BytesIO(_wav(wav)), dtype="float32")[0]


def _pauses(seconds: float, seed: int) -> np.ndarray:
    """Speech-like audio: tone bursts of 0.4-3 s with pauses of 0.15-0.8 s (faint noise)."""
    rng = np.random.default_rng(seed)
    parts, total = [], 0
    while total < seconds * RATE:
        n = int(rng.uniform(0.4, 3.0) * RATE)
        t = np.arange(n) / RATE
        burst = 0.3 * np.sin(2 * np.pi * rng.uniform(120, 400) * t) * np.hanning(n)
        gap = 0.002 * rng.standard_normal(int(rng.uniform(0.15, 0.8) * RATE))
        parts += [burst + 0.02 * rng.standard_normal(n), gap]
        total += n + gap.size
    wav = np.concatenate(parts)[: int(seconds * RATE)]
    return sf.read(io.BytesIO(_wav(wav)), dtype="float32")[0]


def _wav(samples: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.asarray(samples, np.float32), RATE, format="WAV", subtype="PCM_16")
    return buf.getvalue()


REQUESTS = [
    {"seconds": 2.2, "seed": 0, "language": None},
    {"seconds": 3.7, "seed": 1, "language": "German"},
    {"seconds": 3.7, "seed": 1, "language": None},
    {"seconds": 35.0, "seed": 4, "language": None, "pauses": True},
    {"seconds": 40.0, "seed": 5, "language": None, "pauses": True, "max_chunk_seconds": 12},
    # a tone the wide tiny model answers with letters: words for the aligner to time
    {"seconds": 6.0, "seed": 0, "language": "English", "tone": 3.0, "timestamps": True},
]
TIMESTAMPED = 5  # the index of the request above
ALIGN_REQUESTS = [
    {"audio": [(6.0, 3)], "text": ["hello brave new world, it's 42!"], "language": ["English"]},
    {"audio": [(4.0, 6)], "text": ["你好 world 世界 ok"], "language": ["Chinese"]},
    {"audio": [(5.0, 7), (3.0, 8)], "text": ["one two three", "four five"],
     "language": ["English", "English"]},
]  # fmt: skip
LONG = 22 * 60  # seconds: cut at the package's real limits


def _request_audio(r: dict) -> np.ndarray:
    if r.get("tone"):
        t = np.arange(int(RATE * r["seconds"]))
        noise = np.random.default_rng(r["seed"]).standard_normal(t.size)
        return (0.3 * np.sin(t / r["tone"]) + 0.05 * noise).astype(np.float32)
    return (_pauses if r.get("pauses") else _audio)(r["seconds"], r["seed"])


@pytest.fixture(scope="module")
def official(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("qwen3-asr-official")
    checkpoints = ref.official_checkpoints(NAMES, tmp, SCRIPT)
    reqs = []
    for i, r in enumerate(REQUESTS):
        np.save(tmp / f"a{i}.npy", _request_audio(r))
        reqs.append({"audio": str(tmp / f"a{i}.npy"), "max_new_tokens": MAX_NEW,
                     "language": r["language"],
                     "max_chunk_seconds": r.get("max_chunk_seconds"),
                     "timestamps": r.get("timestamps", False)})  # fmt: skip
    results = ref.official_generate({n: reqs for n in NAMES}, checkpoints, tmp, SCRIPT)
    np.save(tmp / "long.npy", _pauses(LONG, 9))
    job = {"cmd": "split", "audio": str(tmp / "long.npy"), "max_seconds": [1200.0, 180.0],
           "out": str(tmp / "split.npz")}  # fmt: skip
    ref.run_official([job], tmp, SCRIPT)
    split = dict(np.load(tmp / "split.npz"))
    jobs, align_reqs = [], []
    for i, r in enumerate(ALIGN_REQUESTS):
        paths = []
        for j, (seconds, seed) in enumerate(r["audio"]):
            np.save(tmp / f"align{i}.{j}.npy", _pauses(seconds, seed))
            paths.append(str(tmp / f"align{i}.{j}.npy"))
        align_reqs.append({**r, "audio": paths})
    for name in NAMES:
        jobs.append({"cmd": "align", "checkpoint": str(checkpoints[name] / "forced_aligner"),
                     "requests": align_reqs, "out": str(tmp / f"{name}.align.npz")})  # fmt: skip
    ref.run_official(jobs, tmp, SCRIPT)
    aligned = {n: dict(np.load(tmp / f"{n}.align.npz")) for n in NAMES}
    return {"checkpoints": checkpoints, "results": results, "tmp": tmp, "split": split,
            "aligned": aligned}  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_word_timestamps_equal_official_aligner(name: str, official: dict) -> None:
    import torch

    from worker.layers.module_weights import load_into
    from worker.models.qwen3_asr.aligner import ForcedAligner
    from worker.models.qwen3_asr.modeling import Qwen3ASRModel

    ck = official["checkpoints"][name] / "forced_aligner"
    with torch.device("meta"):
        model = Qwen3ASRModel(json.loads((ck / "config.json").read_text()))
    load_into(model, ck)
    aligner = ForcedAligner(model.eval(), ck)
    for i, r in enumerate(ALIGN_REQUESTS):
        pairs = zip(r["audio"], r["text"], strict=True)
        clips = [(_pauses(sec, seed), text, 0.0) for (sec, seed), text in pairs]
        got = [[w.word, w.start, w.end] for w in aligner.align(clips)]
        want = [w for clip in json.loads(str(official["aligned"][name][str(i)])) for w in clip]
        assert got == want, f"request {i}"
        assert all(0 <= a <= b for _, a, b in got)
    assert [w for w, _, _ in got] == ["one", "two", "three", "four", "five"]


def test_long_audio_is_cut_where_the_package_cuts(official: dict) -> None:
    from worker.models.qwen3_asr.processor import cut_at_pauses

    wav = np.load(official["tmp"] / "long.npy")
    for limit in (1200.0, 180.0):
        clips = cut_at_pauses(wav, limit)
        assert len(clips) == (2 if limit == 1200.0 else 8)
        assert [off for _, off in clips] == official["split"][f"{limit}.offsets"].tolist()
        assert [c.size for c, _ in clips] == official["split"][f"{limit}.lengths"].tolist()
        # a cut lands in a pause, not at the limit: within 5 s of it, where it is quiet
        cut = int(clips[1][1] * RATE)
        assert abs(cut - limit * RATE) <= 5 * RATE and abs(wav[cut]) < 0.02


@pytest.mark.parametrize("name", NAMES)
def test_transcript_tokens_equal_official(name: str, official: dict) -> None:
    import torch

    from worker.contract.pipeline import merge_languages
    from worker.layers.module_weights import load_into
    from worker.models.qwen3_asr.modeling import Qwen3ASRModel, greedy
    from worker.models.qwen3_asr.processor import ASRProcessor
    from worker.models.qwen3_asr.stages import EOS

    ck = official["checkpoints"][name]
    with torch.device("meta"):
        model = Qwen3ASRModel(json.loads((ck / "config.json").read_text()))
    load_into(model, ck)
    model.eval()
    proc = ASRProcessor(ck)
    res = official["results"][name]
    for i, r in enumerate(REQUESTS):
        hint = proc.language(r["language"])
        longest = r.get("max_chunk_seconds") or (180 if r.get("timestamps") else 1200)
        clips = proc.clips(_request_audio(r), hint, max_seconds=longest)
        assert [c.start for c in clips] == res[f"{i}.offsets"].tolist(), f"request {i}"
        langs, texts = [], []
        for j, clip in enumerate(clips):
            assert clip.ids == res[f"{i}.chunk{j}.prompt"].tolist(), f"prompt {i}.{j}"
            tokens = greedy(model, clip.ids, clip.features, MAX_NEW, set(EOS) | {258})
            assert tokens == res[f"{i}.chunk{j}.tokens"].tolist(), f"request {i}.{j}"
            lang, text = proc.parse(proc.decode(tokens), hint)
            langs.append(lang)
            texts.append(text)
        assert "".join(texts) == str(res[f"{i}.text"]), f"request {i}"
        assert merge_languages(langs) == str(res[f"{i}.language"]), f"request {i}"
        if r.get("max_chunk_seconds"):
            assert len(clips) == 4  # 40 s cut three times near 12 s


def test_worker_transcription_equals_official(official: dict) -> None:
    name = NAMES[1]
    tmp = official["tmp"]
    import yaml

    spec = yaml.safe_load((ref.REPO / "configs" / "models" / "tiny-qwen3-asr.yaml").read_text())
    spec["model_dir"] = str(official["checkpoints"][name])
    spec["stages"]["asr"]["engine"]["max_new_tokens"] = MAX_NEW
    path = tmp / "asr.yaml"
    path.write_text(yaml.safe_dump(spec))
    res = official["results"][name]
    worker = WorkerProcess(
        "--spec", str(path), "--gpus", "cpu", "--cache-dir", str(tmp), "--max-audio-seconds", "40"
    )  # fmt: skip
    url = worker.url + "/v1/audio/transcriptions"

    def post(data: bytes, **fields) -> httpx.Response:
        form = {"model": "tiny-qwen3-asr", **{k: str(v) for k, v in fields.items()}}
        return httpx.post(url, data=form, files={"file": ("a.wav", data, "audio/wav")}, timeout=300)

    try:
        worker.wait_ready(timeout=300)
        for i, r in enumerate(REQUESTS):
            if r.get("max_chunk_seconds"):
                continue  # the worker cuts at the package's real limit
            fields = {"response_format": "verbose_json"}
            if r["language"]:
                fields["language"] = r["language"]
            got = post(_wav(_request_audio(r)), **fields)
            assert got.status_code == 200, got.text
            body = got.json()
            assert body["text"] == str(res[f"{i}.text"]), f"request {i}"
            assert body["language"] == (str(res[f"{i}.language"]) or "unknown")
        data = _wav(_audio(2.2, 0))
        assert post(data, response_format="text").text == str(res["0.text"])
        srt = post(data, response_format="srt")
        assert srt.status_code == 200 and ("-->" in srt.text or not str(res["0.text"]).strip())
        vtt = post(data, response_format="vtt")
        assert vtt.status_code == 200 and vtt.text.startswith("WEBVTT")
        form = {"model": "tiny-qwen3-asr", "stream": "true"}
        files = {"file": ("a.wav", data, "audio/wav")}
        with httpx.stream("POST", url, data=form, files=files, timeout=300) as s:
            events = [line for line in s.iter_lines() if line.startswith("data: ")]
        assert '"transcript.text.done"' in events[-1]
        # 35 s: one clip (the package cuts past 1200 s), at most one segment spanning it
        long = post(_wav(np.tile(_audio(5.0, 2), 7)), response_format="verbose_json")
        assert long.status_code == 200, long.text
        assert long.json()["duration"] == 35.0
        assert [(s["start"], s["end"]) for s in long.json()["segments"]] in ([], [(0.0, 35.0)])
        # word timestamps: the package's transcribe(return_time_stamps=True), word for word
        r = REQUESTS[TIMESTAMPED]
        audio = _wav(_request_audio(r))
        words = "timestamp_granularities[]"
        got = post(audio, response_format="verbose_json", language="English", **{words: "word"})
        assert got.status_code == 200, got.text
        body = got.json()
        stamps = [[w["word"], w["start"], w["end"]] for w in body["words"]]
        assert stamps == json.loads(str(res[f"{TIMESTAMPED}.words"])) and stamps
        assert "segments" not in body and body["text"] == str(res[f"{TIMESTAMPED}.text"])
        form = {"model": "tiny-qwen3-asr", "response_format": "verbose_json",
                "language": "English", words: ["word", "segment"]}  # fmt: skip
        both = httpx.post(
            url, data=form, files={"file": ("a.wav", audio, "audio/wav")}, timeout=300
        )
        assert both.status_code == 200 and both.json()["words"] == body["words"]
        assert both.json()["segments"][0]["end"] == 6.0
        for bad in (
            {words: "char", "response_format": "verbose_json"},
            {words: "word"},
            {words: "word", "response_format": "verbose_json", "stream": "true"},
        ):
            refused = post(audio, **bad)
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["param"] == "timestamp_granularities"
        # bad input: each a clear 400
        for bad, code in (
            (post(b"RIFF\x00\x00junk" * 20), "invalid_audio"),
            (post(_wav(np.zeros(0))), "invalid_audio"),
            (post(_wav(np.tile(_audio(5.0, 3), 9))), "audio_too_long"),
            (post(data, language="Klingon"), "invalid_request"),
            (post(data, response_format="docx"), "invalid_request"),
        ):
            assert bad.status_code == 400, bad.text
            assert bad.json()["error"]["code"] == code, bad.text
    finally:
        worker.stop()
