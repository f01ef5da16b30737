"""Qwen3-ASR (``model_type: qwen3_asr``), written for omni-fleet: ``modeling`` (audio encoder,
Qwen3 decoder), ``processor`` (clips cut near pauses, Whisper features, chat template, output
parsing), ``stages`` (the ``asr`` stage, all clips of all requests stepped as one batch, and the
optional ``aligner`` stage: Qwen3-ForcedAligner word timestamps, ``aligner``)."""

from __future__ import annotations

from planner.spec import Executor
from worker.contract.stage_context import StageContext
from worker.models.family import Family
from worker.stages.base import StageExecutor

MODEL_TYPE = "qwen3_asr"


def make_executor(ctx: StageContext) -> StageExecutor:
    if ctx.stage.executor == Executor.ENCODER:
        from worker.models.qwen3_asr.stages import AlignerExecutor

        return AlignerExecutor(ctx)
    if ctx.stage.executor != Executor.AUTOREGRESSIVE:
        raise ValueError(
            f"stage {ctx.name}: Qwen3-ASR runs an autoregressive stage (audio encoder + "
            f"decoder) and optionally an encoder stage (the forced aligner); not "
            f"{ctx.stage.executor}"
        )
    from worker.models.qwen3_asr.stages import ASRExecutor

    return ASRExecutor(ctx)


FAMILY = Family(
    "Qwen3-ASR",
    MODEL_TYPE,
    make_executor,
    timed_transcripts=True,
    tiny_builder="worker.models.qwen3_asr.tiny",
)
