"""The Qwen3-Omni encoder stages on the tiny checkpoint, in this process: each clip and image is
encoded once, kept by its content (``engine.encoder_cache_bytes``), so a conversation that
resends an earlier turn's clip or image finds it encoded; what comes out equals encoding it
again."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from planner.spec import ModelSpec
from worker.contract.stage_context import StageContext
from worker.models.checkpoint import resolve_checkpoint
from worker.models.qwen3_omni.payloads import MediaEmbeddings, OmniPrompt
from worker.models.registry import make_executor
from worker.stages.base import FINAL, RequestMeta

SPEC = Path(__file__).resolve().parents[2] / "configs" / "models" / "tiny-omni.yaml"
META = RequestMeta("chat", frozenset({"text"}))


@pytest.fixture(scope="module")
def encoders(tmp_path_factory: pytest.TempPathFactory):
    """(cached, uncached) executors of each encoder stage."""
    raw = yaml.safe_load(SPEC.read_text())
    spec = ModelSpec.model_validate(raw)
    ck = resolve_checkpoint(spec, SPEC, tmp_path_factory.mktemp("omni"), log=lambda _m: None)
    out = {}
    for name in ("audio_encoder", "image_encoder"):
        pair = []
        for cache_bytes in (2**20, 0):
            stage = spec.stages[name].model_copy(deep=True)
            stage.engine.encoder_cache_bytes = cache_bytes
            ex = make_executor(StageContext(name, spec, stage, ck, "cpu", 4))
            ex.load()
            pair.append(ex)
        out[name] = tuple(pair)
    return out


def encode(ex, payloads: dict[str, OmniPrompt]) -> dict[str, MediaEmbeddings]:
    """Each request's final payload, the requests in one batch."""
    for rid, payload in payloads.items():
        ex.start(rid, META, {"preprocessing": payload})
    got: dict[str, MediaEmbeddings] = {}
    while len(got) < len(payloads):
        time.sleep(0.003)  # (the batching window)
        got |= {rid: data for kind, rid, data in ex.step() if kind == FINAL}
    return got


def clips(mels: int, *frames: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((mels, n), dtype=np.float32) for n in frames]


def audio(*parts: np.ndarray) -> OmniPrompt:
    features = np.concatenate(parts, axis=1)
    return OmniPrompt([], audio_features=features, audio_lens=[p.shape[1] for p in parts])


def test_a_clip_is_encoded_once(encoders) -> None:
    cached, fresh = encoders["audio_encoder"]
    mels = cached.config.thinker_config.audio_config.num_mel_bins
    x, y = clips(mels, 230, 170, seed=1)
    first = encode(cached, {"a": audio(x)})["a"].audio
    hits, misses = cached.cache.hits, cached.cache.misses
    # the next turn resends x beside a new clip y, batched with another request carrying y
    got = encode(cached, {"b": audio(x, y), "c": audio(y)})
    assert (cached.cache.hits - hits, cached.cache.misses - misses) == (1, 1)
    b, c = got["b"].audio, got["c"].audio
    assert torch.equal(b[: len(first)], first) and torch.equal(b[len(first) :], c)
    want = encode(fresh, {"b": audio(x, y)})["b"].audio
    torch.testing.assert_close(b, want, rtol=1e-5, atol=1e-5)
    assert len(fresh.cache) == 0 and fresh.cache.bytes == 0  # (encoder_cache_bytes 0)


def test_an_image_is_encoded_once(encoders) -> None:
    cached, fresh = encoders["image_encoder"]
    cfg = cached.config.thinker_config.vision_config
    dim = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
    merge = cfg.spatial_merge_size
    grids = [np.array([1, 2 * merge, 2 * merge]), np.array([1, 4 * merge, 2 * merge])]
    rng = np.random.default_rng(2)
    images = [rng.standard_normal((int(g.prod()), dim), dtype=np.float32) for g in grids]

    def payload(*which: int) -> OmniPrompt:
        pixels = np.concatenate([images[i] for i in which])
        return OmniPrompt([], pixel_values=pixels, image_grid=np.stack([grids[i] for i in which]))

    first = encode(cached, {"a": payload(0)})["a"]
    hits = cached.cache.hits
    second = encode(cached, {"b": payload(0, 1)})["b"]
    assert cached.cache.hits - hits == 1
    n = len(first.image)
    assert torch.equal(second.image[:n], first.image)
    assert torch.equal(second.image_deepstack[:, :n], first.image_deepstack)
    want = encode(fresh, {"b": payload(0, 1)})["b"]
    for key in ("image", "image_deepstack"):
        got, expected = getattr(second, key), getattr(want, key)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
