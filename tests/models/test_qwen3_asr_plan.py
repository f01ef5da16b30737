"""omni-plan counts Qwen3-ForcedAligner as its own stage: the aligned Qwen3-ASR specs hold the
ASR model and the aligner (the checkpoint's ``forced_aligner/``) with their exact parameter
counts, in the one process that hands clips from ``asr`` to ``aligner``."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.api import plan_spec

MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"


@pytest.mark.parametrize(
    ("spec", "gpus", "params", "dtype_bytes"),
    [
        ("qwen3-asr-0.6b-aligned.yaml", "1xL4-24GB", {"asr": 782_426_112, "aligner": 917_728_896},
         2),
        ("tiny-qwen3-asr.yaml", "cpu", {"aligner": 61_224}, 4),
    ],
)  # fmt: skip
def test_aligner_is_planned_with_its_exact_weights(
    spec: str, gpus: str, params: dict[str, int], dtype_bytes: int
) -> None:
    plan = plan_spec(MODELS / spec, gpus).plan
    assert plan.fits
    (process,) = plan.nodes[0].processes
    weights = {sp.stage: sp.memory.weights for sp in process.stages}
    assert set(weights) == {"asr", "aligner"}
    for stage, count in params.items():
        assert weights[stage] == count * dtype_bytes, stage
