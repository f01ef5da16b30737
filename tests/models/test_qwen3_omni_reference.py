"""Qwen3-Omni served by omni-worker equals transformers' own ``generate`` on the same checkpoint.

A real worker process (every stage group in its own process, HTTP on loopback) serves a tiny
random-weight checkpoint of the real architecture; ``Qwen3OmniMoeForConditionalGeneration``
loads the same directory and generates greedily. The text, the token counts and the waveform
must agree. Two checkpoints of different sizes (experts, code groups, widths) run the same test.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import io
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
import yaml

from tests.models.waveforms import assert_same_waveform
from tests.worker_procs import WorkerProcess

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "configs" / "models" / "tiny-omni.yaml"
MAX_TOKENS = 24
PROMPT = "Say something."
FRAME = 1920  # 24 kHz samples per 12.5 Hz codec frame (code2wav's upsampling, both checkpoints)
# transformers' code2wav decodes a long reply in chunks of 300 frames, each after 25 frames of
# left context: a talker reply past that is what shows that the worker's stateful vocoder
# continues across the chunk boundary as the reference does
LONG_TALKER_FRAMES = 330

pytestmark = pytest.mark.slow


def _spec_for(model: str, tmp: Path) -> Path:
    """The tiny spec on checkpoint ``model``."""
    spec = yaml.safe_load(SPEC.read_text())
    spec["model_dir"] = str(REPO / "configs" / "hf" / model)
    path = tmp / f"{model}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


NO_MEDIA_STATES = ("--thinker.engine.media_state_bytes", "1")


@dataclass
class Served:
    worker: WorkerProcess
    checkpoint: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Served]]:
    """One worker per tiny checkpoint (and spec overrides) for the whole module (started on
    first use)."""
    running: dict[tuple[str, ...], Served] = {}

    def get(model: str, *overrides: str) -> Served:
        key = (model, *overrides)
        if key not in running:
            tmp = tmp_path_factory.mktemp(model)
            cache = tmp / "cache"
            spec = _spec_for(model, tmp)
            worker = WorkerProcess(
                "--spec", str(spec), "--gpus", "cpu", "--cache-dir", str(cache), *overrides
            )
            worker.wait_ready(timeout=240)
            (checkpoint,) = [p for p in cache.iterdir() if p.name.startswith("tiny-omni")]
            running[key] = Served(worker, checkpoint)
        return running[key]

    yield get
    for s in running.values():
        s.worker.proc.terminate()
        s.worker.wait_exit(60)


def _input_audio(low: float = 200.0) -> tuple[bytes, np.ndarray]:
    """One second of a chirp from ``low`` Hz as 16-bit WAV, and the float samples the worker
    decodes from it."""
    t = np.arange(16_000) / 16_000
    pcm = (0.3 * np.sin(2 * np.pi * (low + 300 * t) * t) * 32767).astype(np.int16)
    buf = io.BytesIO()
    sf.write(buf, pcm, 16_000, format="WAV", subtype="PCM_16")
    return buf.getvalue(), pcm.astype(np.float32) / 32768.0


def _image() -> tuple[str, np.ndarray]:
    """A 40x56 RGB test pattern as a PNG data URL, and its pixels."""
    from PIL import Image

    y, x = np.mgrid[0:40, 0:56]
    pixels = np.stack([x * 4, y * 6, (x + y) * 2], axis=-1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode(), pixels


def _video() -> tuple[str, np.ndarray]:
    """Five frames of a moving square as an MPEG-4 data URL, and the frames the worker decodes."""
    import av

    from worker.api.video import decode_video

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=2)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(5):
            img = np.zeros((48, 64, 3), np.uint8)
            img[8:24, 8 + 8 * i : 24 + 8 * i] = (255, 128, 0)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        out.mux(stream.encode())
    raw = buf.getvalue()
    video = decode_video(raw, "test")
    return "data:video/mp4;base64," + base64.b64encode(raw).decode(), video.frames


@dataclass
class Reply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    pcm: np.ndarray | None  # int16 at 24 kHz when speech was asked for
    cached_tokens: int = 0  # (the worker's: prompt tokens its prefix cache served)


def _ask(worker: WorkerProcess, parts: list[dict], speech: bool) -> Reply:
    """One greedy chat request over HTTP (``temperature: 0``: the talker greedy too, as the
    reference's ``talker_do_sample=False``); ``parts`` in the OpenAI content-part shape."""
    messages = [{"role": "user", "content": [*parts, {"type": "text", "text": PROMPT}]}]
    return _ask_messages(worker, messages, speech)


def _chat_body(messages: list[dict], audio_format: str | None) -> dict:
    """A greedy chat request, spoken in ``audio_format`` unless that is None."""
    body: dict = {
        "model": "tiny-omni",
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    if audio_format is not None:
        body |= {
            "modalities": ["text", "audio"],
            "audio": {"voice": "ethan", "format": audio_format},
        }
    return body


def _ask_messages(worker: WorkerProcess, messages: list[dict], speech: bool) -> Reply:
    body = _chat_body(messages, "wav" if speech else None)
    r = httpx.post(worker.url + "/v1/chat/completions", json=body, timeout=180)
    assert r.status_code == 200, r.text
    reply = r.json()
    message, usage = reply["choices"][0]["message"], reply["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    counts = (usage["prompt_tokens"], usage["completion_tokens"])
    if not speech:
        return Reply(message["content"], *counts, None, cached)
    pcm, rate = sf.read(io.BytesIO(base64.b64decode(message["audio"]["data"])), dtype="int16")
    assert rate == 24_000
    return Reply(message["audio"]["transcript"], *counts, pcm, cached)


def _ask_streamed(worker: WorkerProcess, parts: list[dict]) -> np.ndarray:
    """The same greedy spoken request streamed (``pcm16`` audio deltas): the int16 samples."""
    messages = [{"role": "user", "content": [*parts, {"type": "text", "text": PROMPT}]}]
    body = _chat_body(messages, "pcm16") | {"stream": True}
    pieces: list[bytes] = []
    with httpx.stream("POST", worker.url + "/v1/chat/completions", json=body, timeout=180) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                audio = (choice.get("delta") or {}).get("audio") or {}
                if audio.get("data"):
                    pieces.append(base64.b64decode(audio["data"]))
    assert len(pieces) > 1, "the speech should stream in several pieces"
    return np.frombuffer(b"".join(pieces), np.int16)


def _audio_part(wav: bytes) -> dict:
    return {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"},
    }


def _url_part(kind: str, url: str) -> dict:
    return {"type": f"{kind}_url", f"{kind}_url": {"url": url}}


@functools.cache
def _model(checkpoint: Path):
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32)


def _reference(
    checkpoint: Path, media: list[dict], speech: bool, talker_frames: int | None = None
) -> Reply:
    """``Qwen3OmniMoeForConditionalGeneration.generate`` alone on the same prompt: ``media`` are
    the processor's parts (``audio`` float32 at 16 kHz, ``image`` HxWx3, ``video`` TxHxWx3);
    ``talker_frames`` bounds the talker (the spec's ``max_new_tokens`` by default)."""
    messages = [{"role": "user", "content": [*media, {"type": "text", "text": PROMPT}]}]
    return _reference_messages(checkpoint, messages, speech, talker_frames)


def _reference_messages(
    checkpoint: Path, messages: list[dict], speech: bool, talker_frames: int | None = None
) -> Reply:
    """The same on a whole conversation: each part in its turn, as the chat template takes it."""
    import torch

    from worker.models.qwen3_omni.processor import OmniProcessor, media_parts

    proc = OmniProcessor(checkpoint)
    prepared = proc.prepare(messages)
    inputs: dict = {}
    clips = [p["audio"] for p in media_parts(messages, "audio")]
    if clips:
        feats = proc.features(
            clips, sampling_rate=16_000, padding=True, return_attention_mask=True,
            return_tensors="pt",
        )  # fmt: skip
        inputs["input_features"] = feats["input_features"]
        inputs["feature_attention_mask"] = feats["attention_mask"]
    if prepared.pixel_values is not None:
        inputs["pixel_values"] = torch.from_numpy(prepared.pixel_values)
        inputs["image_grid_thw"] = torch.from_numpy(prepared.image_grid)
    if prepared.video_values is not None:
        inputs["pixel_values_videos"] = torch.from_numpy(prepared.video_values)
        inputs["video_grid_thw"] = torch.from_numpy(prepared.video_grid)
        inputs["video_second_per_grid"] = torch.tensor(prepared.video_seconds)
    config = json.loads((checkpoint / "config.json").read_text())
    im_end = config["im_end_token_id"]
    ids = prepared.input_ids
    common = {"thinker_max_new_tokens": MAX_TOKENS, "thinker_eos_token_id": im_end}
    if speech:
        talker = (
            talker_frames
            or (yaml.safe_load(SPEC.read_text())["stages"]["talker"]["engine"]["max_new_tokens"])
        )
        sequences, wav = _model(checkpoint).generate(
            input_ids=torch.tensor([ids]), speaker="ethan", talker_do_sample=False,
            talker_max_new_tokens=talker, **common, **inputs,
        )  # fmt: skip
        pcm = np.clip(np.round(wav.reshape(-1).float().numpy() * 32767.0), -32768, 32767)
    else:
        sequences = _model(checkpoint).generate(
            input_ids=torch.tensor([ids]), return_audio=False, **common, **inputs
        )
        pcm = None
    tokens = sequences[0, len(ids) :].tolist()
    if tokens and tokens[-1] == im_end:
        tokens = tokens[:-1]
    assert tokens
    text = proc.tokenizer.decode(tokens, skip_special_tokens=True)
    return Reply(text, len(ids), len(tokens), pcm)


def _assert_equal(served: Reply, reference: Reply) -> None:
    assert (served.text, served.prompt_tokens, served.completion_tokens) == (
        reference.text, reference.prompt_tokens, reference.completion_tokens,
    )  # fmt: skip
    if reference.pcm is None:
        assert served.pcm is None
        return
    assert served.pcm is not None
    assert np.abs(reference.pcm).max() > 100  # real audio, not silence
    assert_same_waveform(served.pcm, reference.pcm, FRAME, "the worker's speech")


@pytest.mark.parametrize("kind", ["image", "video"])
def test_visual_chat_equals_transformers_generate(kind: str, served) -> None:
    url, pixels = _image() if kind == "image" else _video()
    tiny = served("tiny-omni")
    reply = _ask(tiny.worker, [_url_part(kind, url)], speech=False)
    media = {"type": kind, kind: pixels, "fps": 2.0}
    _assert_equal(reply, _reference(tiny.checkpoint, [media], speech=False))


def test_speech_about_an_image_equals_transformers_generate(served) -> None:
    url, pixels = _image()
    tiny = served("tiny-omni")
    reply = _ask(tiny.worker, [_url_part("image", url)], speech=True)
    _assert_equal(reply, _reference(tiny.checkpoint, [{"type": "image", "image": pixels}], True))


def test_audio_and_video_in_one_request_equal_transformers_generate(served) -> None:
    """Both encoders feed one prompt (the 3-D positions of a clip and a video). With speech out
    the talker builds on both; ``generate`` cannot (its talker lacks the audio tower's
    ``n_window`` for audio beside a visual input), so its text is the reference there."""
    wav, audio = _input_audio()
    url, frames = _video()
    tiny = served("tiny-omni")
    parts = [_audio_part(wav), _url_part("video", url)]
    media = [{"type": "audio", "audio": audio}, {"type": "video", "video": frames, "fps": 2.0}]
    reference = _reference(tiny.checkpoint, media, speech=False)
    _assert_equal(_ask(tiny.worker, parts, speech=False), reference)
    spoken = _ask(tiny.worker, parts, speech=True)
    assert spoken.pcm is not None and np.abs(spoken.pcm).max() > 100
    _assert_equal(dataclasses.replace(spoken, pcm=None), reference)


def test_concurrent_requests_are_batched_and_each_equals_generate_alone(served) -> None:
    """Requests in flight together share the thinker's and talker's decode steps; each answer
    is still what ``generate`` gives for that request alone."""
    wav, audio = _input_audio()
    url, pixels = _image()
    tiny = served("tiny-omni")
    cases = [  # (HTTP parts, processor parts, speech)
        ([], [], True),
        ([_audio_part(wav)], [{"type": "audio", "audio": audio}], False),
        ([_url_part("image", url)], [{"type": "image", "image": pixels}], True),
        ([], [], False),
    ]
    spans: list[tuple[float, float]] = []

    def ask(case: tuple) -> Reply:
        start = time.monotonic()
        reply = _ask(tiny.worker, case[0], speech=case[2])
        spans.append((start, time.monotonic()))
        return reply

    with ThreadPoolExecutor(len(cases)) as pool:
        replies = list(pool.map(ask, cases))
    # all were in flight at once: the last one started before the first one finished
    assert max(a for a, _ in spans) < min(b for _, b in spans)
    for (_, media, speech), reply in zip(cases, replies, strict=True):
        _assert_equal(reply, _reference(tiny.checkpoint, media, speech))


def test_video_patches_equal_the_image_processor_for_a_still(tmp_path: Path) -> None:
    """Our video patching (torchvision's video processor does not load here) against the
    model's own image processor: a still image is a two-frame video of that image."""
    from PIL import Image

    from planner.spec import ModelSpec
    from worker.models.checkpoint import resolve_checkpoint
    from worker.models.qwen3_omni.processor import OmniProcessor

    spec = ModelSpec.model_validate(yaml.safe_load(SPEC.read_text()))
    proc = OmniProcessor(resolve_checkpoint(spec, SPEC, tmp_path, log=lambda _m: None))
    img = (np.random.default_rng(0).random((48, 64, 3)) * 255).astype(np.uint8)
    size = {k: proc.images.size[k] for k in ("shortest_edge", "longest_edge")}
    expected = proc.images([Image.fromarray(img)], return_tensors="np")
    patches, grid, _ = proc.video_patches(np.stack([img, img]), 2.0, size)
    assert grid.tolist() == expected["image_grid_thw"][0].tolist()
    np.testing.assert_allclose(patches, expected["pixel_values"], atol=1e-5)


@pytest.mark.parametrize("translate", [False, True])
def test_the_thinker_is_asked_to_transcribe_or_translate_in_words(served, translate: bool) -> None:
    """The exact prompt of ``/v1/audio/transcriptions`` and ``/v1/audio/translations`` on
    Qwen3-Omni: the request's prompt as the system's context, then the clip and the instruction
    in the user's turn (English text whatever the clip's language, for a translation)."""
    from worker.contract.options import RequestInput, TranscriptionOptions
    from worker.models.qwen3_omni.preprocess import OmniPreprocess
    from worker.models.qwen3_omni.processor import OmniProcessor

    pre = OmniPreprocess.__new__(OmniPreprocess)  # (its stage context is not needed here)
    pre.processor = OmniProcessor(served("tiny-omni").checkpoint)  # (the module's checkpoint)
    pre.context_length = 2048
    clip = np.zeros(16_000, dtype=np.float32)
    options = TranscriptionOptions(prompt="Names: Oslo.", translate=translate)
    prompt = pre.prepare(RequestInput("transcription", audio=clip, transcription=options))
    text = pre.processor.tokenizer.decode(prompt.input_ids)
    audio = text[text.index("<|audio_start|>") : text.index("<|audio_end|>") + 13]
    task = (
        "Translate the audio into English text." if translate else "Transcribe the audio into text."
    )
    # (the tiny checkpoint's template writes no newline after a role, Qwen's real one does)
    assert text == (
        f"<|im_start|>systemNames: Oslo.<|im_end|>\n<|im_start|>user{audio}{task}"
        "<|im_end|>\n<|im_start|>assistant\n"
    ), text


def test_multi_turn_media_stay_in_their_turns_and_order(served) -> None:
    """An earlier turn's clip and image belong to that turn, and parts keep their order
    (``[text, audio]`` is another prompt than ``[audio, text]``): the worker used to join every
    clip onto the last user turn and put images before the text."""
    wav, audio = _input_audio()
    url, pixels = _image()
    tiny = served("tiny-omni")
    http = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": [{"type": "text", "text": "Listen:"}, _audio_part(wav)]},
        {"role": "assistant", "content": "A rising tone."},
        {
            "role": "user",
            "content": [_url_part("image", url), {"type": "text", "text": "And this?"}],
        },
        {"role": "assistant", "content": "A gradient."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Both again:"},
                _audio_part(wav),
                _url_part("image", url),
            ],
        },
    ]
    processor = [
        http[0],
        {
            "role": "user",
            "content": [{"type": "text", "text": "Listen:"}, {"type": "audio", "audio": audio}],
        },
        http[2],
        {
            "role": "user",
            "content": [{"type": "image", "image": pixels}, {"type": "text", "text": "And this?"}],
        },
        http[4],
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Both again:"},
                {"type": "audio", "audio": audio},
                {"type": "image", "image": pixels},
            ],
        },
    ]
    _assert_equal(
        _ask_messages(tiny.worker, http, speech=False),
        _reference_messages(tiny.checkpoint, processor, speech=False),
    )
    # speech out after a clip in an earlier turn (generate's talker cannot take audio beside
    # an image: see the audio-and-video test)
    again = {"role": "user", "content": "Say it again."}
    spoken = _ask_messages(tiny.worker, [*http[:3], again], speech=True)
    _assert_equal(spoken, _reference_messages(tiny.checkpoint, [*processor[:3], again], True))


def test_a_spoken_reply_reuses_the_cached_prefix_of_a_text_conversation(served) -> None:
    """A spoken reply to a text conversation computes only what the prefix cache does not
    hold (the talker reads text positions by their embeddings, not the thinker's hidden
    states), and still equals transformers' generate."""
    tiny = served("tiny-omni")
    conversation = [
        {"role": "system", "content": "You are a helpful assistant who answers in one line."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Say it again, louder."},
    ]
    warm = _ask_messages(tiny.worker, conversation, speech=False)
    spoken = _ask_messages(tiny.worker, conversation, speech=True)
    assert spoken.cached_tokens >= warm.prompt_tokens - 2, (warm, spoken.cached_tokens)
    _assert_equal(spoken, _reference_messages(tiny.checkpoint, conversation, True))


@pytest.mark.parametrize("kept", [True, False])
def test_a_spoken_voice_conversation_reuses_its_cached_clip(served, kept: bool) -> None:
    """A voice conversation, spoken both ways: the second turn's prompt holds the first
    turn's clip, served from the prefix cache with the hidden states kept of the first turn
    (the talker reads a clip by them: media_states), and equals transformers' generate. With
    no room to keep them (``media_state_bytes`` 1) the second turn finds them gone and is
    computed again whole: equal too. A text reply's prefix never serves a spoken one's clip
    (it kept no states)."""
    tiny = served("tiny-omni") if kept else served("tiny-omni", *NO_MEDIA_STATES)
    wav, audio = _input_audio(low=230.0)  # (a clip of its own: the worker serves other tests)
    from worker.models.qwen3_omni.processor import OmniProcessor

    words = {"type": "text", "text": "Listen:"}
    first = [{"role": "user", "content": [words, _audio_part(wav)]}]
    as_processed = [{"role": "user", "content": [words, {"type": "audio", "audio": audio}]}]
    ids = OmniProcessor(tiny.checkpoint).prepare(as_processed).input_ids
    config = json.loads((tiny.checkpoint / "config.json").read_text())
    clip_at = ids.index(config["thinker_config"]["audio_token_id"])
    _ask_messages(tiny.worker, first, speech=False)
    one = _ask_messages(tiny.worker, first, speech=True)
    assert one.cached_tokens <= clip_at  # (the text before the clip may be another's)
    second = [*first, {"role": "assistant", "content": one.text},
              {"role": "user", "content": "Say it again."}]  # fmt: skip
    two = _ask_messages(tiny.worker, second, speech=True)
    if kept:
        assert two.cached_tokens >= one.prompt_tokens - 2, (one, two.cached_tokens)
    else:
        assert two.cached_tokens == 0
    _assert_equal(two, _reference_messages(tiny.checkpoint, [*as_processed, *second[1:]], True))


@pytest.mark.parametrize(
    ("model", "talker_frames"),
    [("tiny-omni", None), ("tiny-omni-wide", LONG_TALKER_FRAMES)],
)
def test_worker_equals_transformers_generate(model: str, talker_frames: int | None, served) -> None:
    """Audio in, speech out; on the wide checkpoint (a codec of 2,048 codes, as the real
    model's, so that its random talker rarely draws the end) the talker speaks past code2wav's
    first 300-frame chunk, and the streamed speech equals the reference's too."""
    wav, audio = _input_audio()
    overrides = ("--talker.engine.max_new_tokens", str(talker_frames)) if talker_frames else ()
    tiny = served(model, *overrides)
    reply = _ask(tiny.worker, [_audio_part(wav)], speech=True)
    reference = _reference(
        tiny.checkpoint, [{"type": "audio", "audio": audio}], True, talker_frames
    )
    _assert_equal(reply, reference)
    if talker_frames is None:
        return
    assert reference.pcm is not None and reference.pcm.size > 300 * FRAME, reference.pcm.size
    streamed = _ask_streamed(tiny.worker, [_audio_part(wav)])
    assert_same_waveform(streamed, reference.pcm, FRAME, "the worker's streamed speech")
