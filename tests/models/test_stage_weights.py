"""Each Qwen3-Omni stage reads only its own tensors from the checkpoint's shards, and exactly
as many elements as omni-plan counts for it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.spec import ModelSpec
from planner.weights import config_path, count_weights
from worker.layers.stage_weights import load_stage_module
from worker.models.checkpoint import resolve_checkpoint

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "configs" / "models" / "tiny-omni.yaml"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelSpec, Path]:
    spec = ModelSpec.model_validate(yaml.safe_load(SPEC.read_text()))
    cache = tmp_path_factory.mktemp("cache")
    return spec, resolve_checkpoint(spec, SPEC, cache, log=lambda _m: None)


@pytest.mark.parametrize(
    "stage", ["image_encoder", "audio_encoder", "thinker", "talker", "code2wav"]
)
def test_stage_loads_what_the_plan_counts(checkpoint: tuple[ModelSpec, Path], stage: str) -> None:
    spec, ckpt = checkpoint
    comp = spec.stages[stage].component
    assert comp is not None
    module, report = load_stage_module(ckpt, comp, "fp32", "cpu")
    planned = count_weights(config_path(ckpt), comp.module, tuple(comp.exclude))
    assert report.elements == planned.elements
    # nothing of another stage is in the module
    names = [n for n, _ in module.named_parameters()]
    for excluded in comp.exclude:
        assert not any(n.startswith(excluded + ".") for n in names)


def test_thinker_reads_none_of_the_encoders(checkpoint: tuple[ModelSpec, Path]) -> None:
    spec, ckpt = checkpoint
    comp = spec.stages["thinker"].component
    assert comp is not None
    _, report = load_stage_module(ckpt, comp, "fp32", "cpu")
    whole = count_weights(config_path(ckpt), "thinker")
    encoders = sum(
        count_weights(config_path(ckpt), f"thinker.{m}").elements
        for m in ("model.audio_tower", "model.visual")
    )
    assert report.elements == whole.elements - encoders
