"""Exact parameter counts (pinned from configs/hf/SOURCES.md) and KV bytes per token.

Every count here comes from building the config on PyTorch's meta device; nothing is read from
param_counts.json, which was produced independently (see SOURCES.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from planner.errors import ArchitectureError, SpecError
from planner.weights import count_weights, kv_layout, meta_model

HF = Path(__file__).resolve().parent.parent / "configs" / "hf"
OMNI = "Qwen--Qwen3-Omni-30B-A3B-Instruct"


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts in these tests come from real meta builds, never from planner.diskcache."""
    monkeypatch.setenv("OMNI_PLAN_CACHE", "off")


def cfg(model: str, sub: str = "") -> Path:
    return HF / model / sub / "config.json" if sub else HF / model / "config.json"


@pytest.mark.parametrize(
    ("model", "module", "params"),
    [
        (OMNI, "", 35_259_818_545),
        (OMNI, "thinker", 31_719_205_488),
        (OMNI, "thinker.model.audio_tower", 647_927_168),
        (OMNI, "thinker.model.visual", 538_631_408),
        (OMNI, "thinker.model.language_model", 30_221_219_840),
        (OMNI, "thinker.lm_head", 311_427_072),
        (OMNI, "talker", 3_324_596_480),
        (OMNI, "talker.model", 3_167_291_392),
        (OMNI, "talker.code_predictor", 141_570_304),
        (OMNI, "code2wav", 216_016_577),
        ("Qwen--Qwen3-ASR-0.6B", "", 782_426_112),
        ("Qwen--Qwen3-ForcedAligner-0.6B", "", 917_728_896),
        ("Qwen--Qwen3-8B", "", 8_190_735_360),
        ("Qwen--Qwen3-8B", "model.layers", 6_946_071_552),
        ("Qwen--Qwen3-0.6B", "", 596_049_920),
        ("Qwen--Qwen3-0.6B", "model.layers", 440_466_432),
        ("Qwen--Qwen3-30B-A3B", "", 30_532_122_624),
        ("meta-llama--Meta-Llama-3.1-8B", "", 8_030_261_248),
        ("openai--whisper-large-v3", "", 1_543_490_560),
        ("openai--whisper-large-v3", "model.encoder", 636_968_960),
        ("openai--whisper-large-v3", "model.decoder", 906_521_600),
        ("kyutai--mimi", "", 79_308_609),
        ("Qwen--Qwen2.5-Omni-3B", "", 5_537_120_640),
        ("Qwen--Qwen2.5-Omni-3B", "thinker", 4_703_464_448),
        ("Qwen--Qwen2.5-Omni-3B", "talker", 384_604_928),
        ("Qwen--Qwen2.5-Omni-3B", "token2wav", 449_051_264),
        ("sesame--csm-1b", "", 1_632_100_161),
        ("sesame--csm-1b", "backbone_model", 1_107_560_448),
        ("sesame--csm-1b", "depth_decoder", 312_776_704),
        # Qwen3-TTS: not in transformers 5.24, described explicitly (planner/archs/qwen3_tts.py).
        ("Qwen--Qwen3-TTS-12Hz-1.7B-Base", "", 1_928_677_440),
        ("Qwen--Qwen3-TTS-12Hz-1.7B-Base", "talker", 1_916_676_352),
        ("Qwen--Qwen3-TTS-12Hz-1.7B-Base", "talker.model.text_embedding", 311_164_928),
        ("Qwen--Qwen3-TTS-12Hz-1.7B-Base", "talker.model.codec_embedding", 6_291_456),
        ("Qwen--Qwen3-TTS-12Hz-1.7B-Base", "talker.model.layers", 1_409_408_000),
        ("Qwen--Qwen3-TTS-12Hz-1.7B-Base", "talker.text_projection", 8_392_704),
        ("Qwen--Qwen3-TTS-12Hz-1.7B-Base", "talker.codec_head", 6_291_456),
        ("Qwen--Qwen3-TTS-12Hz-1.7B-Base", "talker.code_predictor", 175_125_760),
        ("Qwen--Qwen3-TTS-12Hz-1.7B-Base", "speaker_encoder", 12_001_088),
        ("Qwen--Qwen3-TTS-12Hz-1.7B-CustomVoice", "", 1_916_676_352),
        ("Qwen--Qwen3-TTS-12Hz-0.6B-CustomVoice", "", 905_788_672),
        ("Qwen--Qwen3-TTS-12Hz-0.6B-CustomVoice", "talker.model.layers", 440_466_432),
        ("Qwen--Qwen3-TTS-12Hz-0.6B-CustomVoice", "talker.text_projection", 6_294_528),
        ("Qwen--Qwen3-TTS-12Hz-0.6B-CustomVoice", "talker.code_predictor", 141_570_304),
    ],
)
def test_exact_parameter_counts(model: str, module: str, params: int) -> None:
    assert count_weights(cfg(model), module).params == params


@pytest.mark.parametrize(
    "model",
    [
        "Qwen--Qwen3-TTS-12Hz-1.7B-Base",
        "Qwen--Qwen3-TTS-12Hz-1.7B-CustomVoice",
        "Qwen--Qwen3-TTS-12Hz-0.6B-CustomVoice",
    ],
)
def test_speech_tokenizer_counts_and_stored_codebooks(model: str) -> None:
    path = cfg(model, "speech_tokenizer")
    whole = count_weights(path)
    assert whole.params == 153_714_657
    assert count_weights(path, "encoder").params == 39_391_520
    assert count_weights(path, "decoder").params == 114_323_137
    # The encoder's 32 codebooks (embed_sum + cluster_usage + initialized) are persistent
    # buffers: stored in the checkpoint, so they are counted as weights.
    assert whole.buffers == 32 * (2048 * 256 + 2048 + 1) == 16_842_784
    assert whole.elements * 4 == 682_229_764  # FP32, ~0.68 GB as SOURCES.md notes


def test_omni_has_no_stored_buffers_and_total_matches_the_checkpoint_index() -> None:
    c = count_weights(cfg(OMNI))
    assert c.buffers == 0  # rotary inv_freq etc. are non-persistent
    assert c.elements * 2 == 70_519_637_090  # metadata.total_size of the BF16 checkpoint


def test_exclude_removes_submodules_and_tied_weights_count_once() -> None:
    thinker = count_weights(cfg(OMNI), "thinker", ("model.audio_tower", "model.visual"))
    assert thinker.params == 31_719_205_488 - 647_927_168 - 538_631_408
    # Qwen3-0.6B ties lm_head to embed_tokens: the tensor is counted once, as stored.
    assert count_weights(cfg("Qwen--Qwen3-0.6B"), "lm_head").params == 155_582_464
    body = count_weights(cfg("Qwen--Qwen3-0.6B"), "", ("lm_head",)).params
    assert body == 596_049_920 - 155_582_464


@pytest.mark.parametrize(
    ("model", "module", "per_token"),
    [
        (OMNI, "thinker", 98_304),
        (OMNI, "talker", 20_480),
        (OMNI, "talker.code_predictor", 20_480),
        ("Qwen--Qwen3-TTS-12Hz-1.7B-Base", "", 114_688),
        ("Qwen--Qwen3-TTS-12Hz-0.6B-CustomVoice", "talker", 114_688),
        ("Qwen--Qwen3-TTS-12Hz-1.7B-Base", "talker.code_predictor", 20_480),
        ("Qwen--Qwen3-ASR-0.6B", "", 114_688),
        ("Qwen--Qwen3-8B", "", 147_456),
        ("Qwen--Qwen3-0.6B", "", 114_688),
        ("Qwen--Qwen3-30B-A3B", "", 98_304),
        ("meta-llama--Meta-Llama-3.1-8B", "", 131_072),
        ("openai--whisper-large-v3", "model.decoder", 163_840),
        ("Qwen--Qwen2.5-Omni-3B", "thinker", 36_864),
        ("Qwen--Qwen2.5-Omni-3B", "talker", 12_288),
        ("sesame--csm-1b", "backbone_model", 32_768),
        ("sesame--csm-1b", "depth_decoder", 4_096),
    ],
)
def test_kv_bytes_per_token_bf16(model: str, module: str, per_token: int) -> None:
    assert kv_layout(cfg(model), module).bytes_per_token(2) == per_token


def test_kv_per_rank_splits_kv_heads_and_replicates_when_fewer_than_ranks() -> None:
    thinker = kv_layout(cfg(OMNI), "thinker")  # 4 KV heads
    assert thinker.bytes_per_token(2, tp_size=2) == 98_304 // 2
    assert thinker.bytes_per_token(2, tp_size=8) == 98_304 // 4  # one head per rank, replicated


def test_transformers_alone_misreads_qwen3_asr_and_the_planner_does_not() -> None:
    """The pitfall is real in this transformers version; the explicit mapping avoids it.
    (transformers alone: in a fresh interpreter, as SGLang, imported by other tests in this
    process, registers configs of its own with transformers.)"""
    naive = f"""
import json, torch
from transformers import AutoConfig, Qwen3ASRForConditionalGeneration
raw = json.load(open({str(cfg("Qwen--Qwen3-ASR-0.6B"))!r}))
with torch.device("meta"):
    model = Qwen3ASRForConditionalGeneration(AutoConfig.for_model(**raw))
print(sum(p.numel() for p in model.parameters()))
"""
    out = subprocess.run([sys.executable, "-c", naive], capture_output=True, text=True)
    assert out.stdout.split()[-1:] == ["2039626880"], out.stderr[-2000:]
    assert meta_model(cfg("Qwen--Qwen3-ASR-0.6B")).builder == "explicit:qwen3_asr"


def test_meta_builds_are_cached_until_the_config_changes(tmp_path: Path) -> None:
    src = cfg("Qwen--Qwen3-0.6B")
    dst = tmp_path / "m" / "config.json"
    dst.parent.mkdir()
    shutil.copy(src, dst)
    first = meta_model(dst)
    assert meta_model(dst) is first
    raw = json.loads(dst.read_text())
    raw["num_hidden_layers"] = 2
    dst.write_text(json.dumps(raw))
    smaller = count_weights(dst)
    assert meta_model(dst) is not first
    assert smaller.params == 596_049_920 - 26 * (440_466_432 // 28)


def test_unknown_architecture_is_an_error_never_a_default(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no_such_model"}))
    with pytest.raises(ArchitectureError, match="does not know model_type 'no_such_model'"):
        count_weights(tmp_path / "config.json")


def test_unknown_module_lists_the_real_children() -> None:
    with pytest.raises(SpecError, match=r"unknown module 'talkr'.*did you mean 'talker'"):
        count_weights(cfg(OMNI), "talkr")


def test_disk_cache_remembers_by_content_and_ignores_corrupt_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from planner import diskcache

    monkeypatch.setenv("OMNI_PLAN_CACHE", str(tmp_path / "cache"))
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "qwen3"}')
    calls: list[int] = []

    def compute() -> dict:
        calls.append(1)
        return {"params": len(calls)}

    assert diskcache.memo(config, ("count", ""), compute) == {"params": 1}
    assert diskcache.memo(config, ("count", ""), compute) == {"params": 1}  # a hit
    assert diskcache.memo(config, ("count", "talker"), compute) == {"params": 2}  # other query
    config.write_text('{"model_type": "qwen3", "x": 1}')
    assert diskcache.memo(config, ("count", ""), compute) == {"params": 3}  # content changed
    for entry in (tmp_path / "cache").rglob("*.json"):
        entry.write_text("{not json")
    assert diskcache.memo(config, ("count", ""), compute) == {"params": 4}  # corrupt: recomputed
    monkeypatch.setenv("OMNI_PLAN_CACHE", "off")
    assert diskcache.memo(config, ("count", ""), compute) == {"params": 5}
    assert len(calls) == 5
