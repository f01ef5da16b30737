"""Executor kind (+ backend) in the spec -> the class that implements it."""

from __future__ import annotations

from planner.spec import Backend, Executor
from worker.stages.base import StageContext, StageExecutor


def make_executor(ctx: StageContext) -> StageExecutor:
    family = _family(ctx)
    sglang = ctx.stage.engine.backend == Backend.SGLANG
    if sglang and (family is None or not family.runs_on_sglang(ctx)):
        # refused when the worker starts, not at the first request
        raise ValueError(
            f"stage {ctx.name}: engine.backend 'sglang' serves the Qwen3-Omni thinker and the "
            "Qwen3-ASR decoder (the talkers, the aligner and plain models run on backend "
            "'transformers')"
        )
    if family is not None:
        return family.make_executor(ctx)
    kind = ctx.stage.executor
    cls: type[StageExecutor]
    if kind == Executor.PREPROCESS:
        from worker.stages.preprocess import PreprocessExecutor as cls
    elif kind == Executor.AUTOREGRESSIVE:
        from worker.stages.autoregressive import AutoregressiveExecutor as cls
    elif kind == Executor.DECODE:
        from worker.stages.decode import DecodeExecutor as cls
    elif kind == Executor.AGGREGATE:
        from worker.stages.aggregate import AggregateExecutor as cls
    else:  # encoders and vocoders are model-specific: their family implements them
        raise ValueError(
            f"stage {ctx.name}: a {kind} stage needs a model family under worker/models/ "
            "(Qwen3-Omni, Qwen3-TTS, Qwen3-ASR); a plain transformers model has none"
        )
    return cls(ctx)


def _family(ctx: StageContext):
    """The model family's own executors, by the checkpoint's ``model_type`` (one home per
    family under ``worker/models/``); None for generic transformers models."""
    import json

    try:
        model_type = json.loads((ctx.checkpoint / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None
    if model_type == "qwen3_omni_moe":
        from worker.models import qwen3_omni

        return qwen3_omni
    if model_type == "qwen3_tts":
        from worker.models import qwen3_tts

        return qwen3_tts
    if model_type == "qwen3_asr":
        from worker.models import qwen3_asr

        return qwen3_asr
    return None
