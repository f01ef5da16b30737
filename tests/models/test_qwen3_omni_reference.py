"""Qwen3-Omni served by omni-worker equals transformers' own ``generate`` on the same checkpoint.

A real worker process (every stage group in its own process, HTTP on loopback) serves a tiny
random-weight checkpoint of the real architecture; ``Qwen3OmniMoeForConditionalGeneration``
loads the same directory and generates greedily. The text, the token counts and the waveform
must agree. Two checkpoints of different sizes (experts, code groups, widths) run the same test.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
import yaml

from tests.worker_procs import WorkerProcess

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "configs" / "models" / "tiny-omni.yaml"
MAX_TOKENS = 24
PROMPT = "Say something."

pytestmark = pytest.mark.slow


def _spec_for(model: str, tmp: Path) -> Path:
    spec = yaml.safe_load(SPEC.read_text())
    spec["model_dir"] = str(REPO / "configs" / "hf" / model)
    path = tmp / f"{model}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@dataclass
class Served:
    worker: WorkerProcess
    checkpoint: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Served]]:
    """One worker per tiny checkpoint for the whole module (started on first use)."""
    running: dict[str, Served] = {}

    def get(model: str) -> Served:
        if model not in running:
            tmp = tmp_path_factory.mktemp(model)
            cache = tmp / "cache"
            spec = _spec_for(model, tmp)
            worker = WorkerProcess("--spec", str(spec), "--gpus", "cpu", "--cache-dir", str(cache))
            worker.wait_ready(timeout=240)
            (checkpoint,) = [p for p in cache.iterdir() if p.name.startswith("tiny-omni")]
            running[model] = Served(worker, checkpoint)
        return running[model]

    yield get
    for s in running.values():
        s.worker.proc.terminate()
        s.worker.wait_exit(60)


def _input_audio() -> tuple[bytes, np.ndarray]:
    """One second of a chirp as 16-bit WAV, and the float samples the worker decodes from it."""
    t = np.arange(16_000) / 16_000
    pcm = (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t) * 32767).astype(np.int16)
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


@pytest.mark.parametrize("kind", ["image", "video"])
def test_visual_chat_equals_transformers_generate(kind: str, served) -> None:
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from worker.models.qwen3_omni.processor import OmniProcessor

    url, pixels = _image() if kind == "image" else _video()
    tiny = served("tiny-omni")
    part = {"type": f"{kind}_url", f"{kind}_url": {"url": url}}
    body = {
        "model": "tiny-omni",
        "messages": [{"role": "user", "content": [part, {"type": "text", "text": PROMPT}]}],
        "max_tokens": MAX_TOKENS,
    }
    r = httpx.post(tiny.worker.url + "/v1/chat/completions", json=body, timeout=180)
    assert r.status_code == 200, r.text
    reply = r.json()
    checkpoint = tiny.checkpoint
    proc = OmniProcessor(checkpoint)
    media = {"type": kind, kind: pixels, "fps": 2.0}
    prepared = proc.prepare(
        [{"role": "user", "content": [media, {"type": "text", "text": PROMPT}]}]
    )
    if kind == "image":
        visual = {
            "pixel_values": torch.from_numpy(prepared.pixel_values),
            "image_grid_thw": torch.from_numpy(prepared.image_grid),
        }
    else:
        visual = {
            "pixel_values_videos": torch.from_numpy(prepared.video_values),
            "video_grid_thw": torch.from_numpy(prepared.video_grid),
            "video_second_per_grid": torch.tensor(prepared.video_seconds),
        }
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32)
    im_end = json.loads((checkpoint / "config.json").read_text())["im_end_token_id"]
    sequences = model.generate(
        input_ids=torch.tensor([prepared.input_ids]),
        return_audio=False,
        thinker_max_new_tokens=MAX_TOKENS,
        thinker_eos_token_id=im_end,
        **visual,
    )
    tokens = sequences[0, len(prepared.input_ids) :].tolist()
    if tokens and tokens[-1] == im_end:
        tokens = tokens[:-1]
    assert tokens
    assert reply["usage"]["prompt_tokens"] == len(prepared.input_ids)
    assert reply["usage"]["completion_tokens"] == len(tokens)
    assert reply["choices"][0]["message"]["content"] == proc.tokenizer.decode(
        tokens, skip_special_tokens=True
    )


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


def _reference(checkpoint: Path, audio: np.ndarray) -> tuple[str, int, np.ndarray]:
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from worker.models.qwen3_omni.processor import OmniProcessor

    proc = OmniProcessor(checkpoint)
    messages = [
        {
            "role": "user",
            "content": [{"type": "audio", "audio": audio}, {"type": "text", "text": PROMPT}],
        }
    ]
    ids = proc.prepare(messages).input_ids
    feats = proc.features(
        [audio], sampling_rate=16_000, padding=True, return_attention_mask=True, return_tensors="pt"
    )
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32)
    config = json.loads((checkpoint / "config.json").read_text())
    talker_max = yaml.safe_load(SPEC.read_text())["stages"]["talker"]["engine"]["max_new_tokens"]
    sequences, wav = model.generate(
        input_ids=torch.tensor([ids]),
        input_features=feats["input_features"],
        feature_attention_mask=feats["attention_mask"],
        speaker="ethan",
        thinker_max_new_tokens=MAX_TOKENS,
        thinker_eos_token_id=config["im_end_token_id"],
        talker_do_sample=False,
        talker_max_new_tokens=talker_max,
    )
    reply = sequences[0, len(ids) :].tolist()
    if reply and reply[-1] == config["im_end_token_id"]:
        reply = reply[:-1]
    text = proc.tokenizer.decode(reply, skip_special_tokens=True)
    return text, len(reply), wav.reshape(-1).float().numpy()


@pytest.mark.parametrize("model", ["tiny-omni", "tiny-omni-wide"])
def test_worker_equals_transformers_generate(model: str, served) -> None:
    wav_bytes, audio = _input_audio()
    tiny = served(model)
    audio_part = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(wav_bytes).decode(), "format": "wav"},
    }
    body = {
        "model": "tiny-omni",
        "messages": [{"role": "user", "content": [audio_part, {"type": "text", "text": PROMPT}]}],
        "max_tokens": MAX_TOKENS,
        "modalities": ["text", "audio"],
        "audio": {"voice": "ethan", "format": "wav"},
    }
    r = httpx.post(tiny.worker.url + "/v1/chat/completions", json=body, timeout=180)
    assert r.status_code == 200, r.text
    reply = r.json()
    checkpoint = tiny.checkpoint
    text, n_tokens, ref_wav = _reference(checkpoint, audio)
    message = reply["choices"][0]["message"]
    assert n_tokens > 0
    assert reply["usage"]["completion_tokens"] == n_tokens
    assert message["audio"]["transcript"] == text
    pcm, rate = sf.read(io.BytesIO(base64.b64decode(message["audio"]["data"])), dtype="int16")
    assert rate == 24_000
    expected = np.clip(np.round(ref_wav * 32767.0), -32768, 32767)
    assert pcm.shape == expected.shape
    assert np.abs(expected).max() > 100  # real audio, not silence
    assert np.abs(pcm.astype(np.int32) - expected).max() <= 2
