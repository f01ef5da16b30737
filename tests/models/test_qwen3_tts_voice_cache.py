"""A cloned voice's reference codes and speaker embedding are computed once per voice.

The embedded tiny Qwen3-TTS Base checkpoint runs its three real stage executors in this process
(preprocessing with the speech tokenizer's encoder, the talker with its speaker encoder, the
vocoder), driven request by request as the stage host drives them. The speech API sends an
uploaded voice's content hash as ``voice_key``: the second request of a voice must not run the
encoder or the speaker encoder again (the stages' counters), and its audio must be the bytes
the first request produced, which are the bytes of a request that bypasses the cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.models.tts_stages import loaded_stages, start, step
from worker.contract.options import RequestInput, SpeechOptions
from worker.contract.sampling import Sampling
from worker.stages.base import RequestMeta

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "configs" / "models" / "tiny-qwen3-tts-base.yaml"
MAX_NEW = 6


@pytest.fixture(scope="module")
def stages(tmp_path_factory) -> Iterator[dict]:
    with loaded_stages(SPEC, tmp_path_factory.mktemp("tts-base")) as loaded:
        yield loaded


def _voice(seed: int) -> np.ndarray:
    t = np.arange(24_000) / 24_000
    noise = np.random.default_rng(seed).normal(size=t.size)
    return (0.3 * np.sin(2 * np.pi * (150 + 40 * seed) * t) + 0.02 * noise).astype(np.float32)


def _speak(stages: dict, rid: str, wav: np.ndarray, key: str | None) -> bytes:
    """One speech request through preprocessing -> tts_engine => vocoder; its pcm16 bytes."""
    # (one seed: the cached and uncached runs draw alike)
    meta = RequestMeta("speech", frozenset({"audio"}), speech_sampling=Sampling(seed=3))
    opts = SpeechOptions(ref_text="what the voice says", voice_key=key)
    req = RequestInput("speech", text="cloned", voice="v", voice_audio=wav, speech=opts)
    start(stages, rid, meta, req, MAX_NEW, True)
    pcm: list[bytes] = []
    while not step(stages, rid, pcm)[1]:
        pass
    return b"".join(pcm)


def test_second_request_of_a_voice_reuses_codes_and_embedding(stages: dict) -> None:
    codes, embeddings = stages["preprocessing"].voice_codes, stages["tts_engine"].voice_embeddings
    alice, bob = _voice(1), _voice(2)
    uncached = _speak(stages, "r0", alice, None)
    assert (codes.computed, embeddings.computed, len(codes), len(embeddings)) == (1, 1, 0, 0)
    first = _speak(stages, "r1", alice, "sha-alice")
    second = _speak(stages, "r2", alice, "sha-alice")
    assert (codes.computed, embeddings.computed) == (2, 2)  # the second request computed nothing
    assert (codes.hits, embeddings.hits) == (1, 1)
    assert len(first) > 0 and first == second == uncached
    other = _speak(stages, "r3", bob, "sha-bob")
    assert (codes.computed, embeddings.computed) == (3, 3) and other != first


def test_cache_is_bounded_least_recently_used_first() -> None:
    from worker.models.qwen3_tts.voice_cache import VoiceCache

    cache = VoiceCache(capacity=2)
    calls: list[str] = []

    def get(key: str) -> str:
        return cache.get(key, lambda: calls.append(key) or key.upper())

    assert [get("a"), get("b"), get("a"), get("c")] == ["A", "B", "A", "C"]
    assert len(cache) == 2 and calls == ["a", "b", "c"]  # "b" was least recently used
    get("b")
    assert calls == ["a", "b", "c", "b"] and cache.hits == 1


def test_the_checkpoints_max_new_tokens_bounds_the_specs() -> None:
    """The talker stops at the checkpoint's generation_config ``max_new_tokens`` where it is
    below the spec's (it used the spec's 1536 over a checkpoint's 400)."""
    from worker.models.qwen3_tts.talker import frame_budget

    assert frame_budget(1536, {"max_new_tokens": 400}) == 400
    assert frame_budget(64, {"max_new_tokens": 400}) == 64
    assert frame_budget(64, {}) == 64
