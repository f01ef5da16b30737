"""Qwen3-ASR (``model_type: qwen3_asr``), written for omni-fleet: ``modeling`` (audio encoder,
Qwen3 decoder), ``processor`` (30 s clips, Whisper features, chat template, output parsing),
``stages`` (the one ``asr`` stage, all clips of all requests stepped as one batch)."""

from __future__ import annotations

from planner.spec import Executor
from worker.stages.base import StageContext, StageExecutor

MODEL_TYPE = "qwen3_asr"


def make_executor(ctx: StageContext) -> StageExecutor:
    if ctx.stage.executor != Executor.AUTOREGRESSIVE:
        raise ValueError(
            f"stage {ctx.name}: Qwen3-ASR has one stage, an autoregressive one (audio encoder + "
            f"decoder); not {ctx.stage.executor}"
        )
    from worker.models.qwen3_asr.stages import ASRExecutor

    return ASRExecutor(ctx)
