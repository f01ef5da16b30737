"""Qwen3-Omni (``model_type: qwen3_omni_moe``): every stage of the real model, built from
transformers' own classes and loaded from the checkpoint's shards one stage at a time.

Stages by the component they hold: preprocessing (the model's processor), the audio tower and
the vision encoder (``thinker.model.audio_tower`` / ``thinker.model.visual``), the thinker
(``thinker`` without the encoders), decode (the tokenizer), the talker with its code predictor
(``talker``) and ``code2wav``.
"""

from __future__ import annotations

from planner.spec import Executor
from worker.contract.stage_context import StageContext
from worker.models.family import Family
from worker.stages.base import StageExecutor

MODEL_TYPE = "qwen3_omni_moe"


def make_executor(ctx: StageContext) -> StageExecutor:
    kind = ctx.stage.executor
    cls: type[StageExecutor]
    module = ctx.stage.component.module if ctx.stage.component else ""
    if kind == Executor.PREPROCESS:
        from worker.models.qwen3_omni.preprocess import OmniPreprocess as cls
    elif kind == Executor.DECODE:
        from worker.stages.decode import DecodeExecutor as cls
    elif kind == Executor.AGGREGATE:
        from worker.stages.aggregate import AggregateExecutor as cls
    elif module == "thinker.model.audio_tower":
        from worker.models.qwen3_omni.encoders import AudioTowerExecutor as cls
    elif module == "thinker.model.visual":
        from worker.models.qwen3_omni.encoders import VisionExecutor as cls
    elif module == "thinker":
        from worker.models.qwen3_omni.thinker import ThinkerExecutor as cls
    elif module == "talker":
        from worker.models.qwen3_omni.talker import TalkerExecutor as cls
    elif module == "code2wav":
        from worker.models.qwen3_omni.code2wav import Code2WavExecutor as cls
    else:
        raise ValueError(
            f"stage {ctx.name}: Qwen3-Omni has no stage for executor {kind} with component "
            f"{module!r}; components: thinker.model.audio_tower, thinker.model.visual, thinker, "
            "talker, code2wav"
        )
    return cls(ctx)


FAMILY = Family(
    "Qwen3-Omni",
    MODEL_TYPE,
    make_executor,
    translates=True,
    tiny_builder="worker.models.qwen3_omni.tiny",
)
