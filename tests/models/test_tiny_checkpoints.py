"""The embedded tiny checkpoints are the same on every build and every machine.

Tests compare voices, texts and waveforms built from these weights; a tensor left as
``torch.empty`` memory makes them differ from run to run (or only on CI's CPU). Each builder
runs twice, with freed NaN-filled memory in between for an uninitialised tensor to pick up.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from planner.spec import ModelSpec
from worker.models.checkpoint import SEED_FILE, _build_seeded

REPO = Path(__file__).resolve().parents[2]
TINY = ["tiny-omni", "tiny-qwen3-tts-base", "tiny-qwen3-tts-custom-voice", "tiny-qwen3-asr"]


def tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(checkpoint.rglob("*.safetensors")):
        weights.update(
            {f"{shard.relative_to(checkpoint)}:{k}": v for k, v in load_file(shard).items()}
        )
    return weights


def build(config_dir: Path, out: Path) -> dict[str, torch.Tensor]:
    dirt = [torch.full((n,), float("nan")) for n in (64, 512, 4096, 32768) for _ in range(64)]
    del dirt
    seed = int(json.loads((config_dir / SEED_FILE).read_text())["seed"])
    _build_seeded(ModelSpec.model_construct(name=config_dir.name, stages={}), config_dir, out, seed)
    return tensors(out)


@pytest.mark.parametrize("name", TINY)
def test_tiny_checkpoint_is_reproducible(name: str, tmp_path: Path) -> None:
    config_dir = REPO / "configs" / "hf" / name
    first = build(config_dir, tmp_path / "a")
    second = build(config_dir, tmp_path / "b")
    assert first.keys() == second.keys() and first
    differ = [k for k in first if not torch.equal(first[k], second[k])]
    assert not differ, f"{name}: tensors differ between two seeded builds: {differ[:5]}"
    broken = [k for k, v in first.items() if v.is_floating_point() and not v.isfinite().all()]
    assert not broken, f"{name}: non-finite weights: {broken[:5]}"
