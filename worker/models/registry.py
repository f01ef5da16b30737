"""The model families, one entry each, found by the checkpoint's ``model_type``.

A family is one home under ``worker/models/`` (as SGLang-Omni keeps one folder per model): its
stage executors and what its API speaks beyond the common surface. The worker's service
resolves its family once, for the endpoints; each stage process resolves it once, for its
executors (``make_executor``). A checkpoint of no family is ``PLAIN``: a plain language model,
served by the generic executors of ``worker.stages`` (its autoregressive stage on SGLang's own
model class for the checkpoint), with every capability above off.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from planner.spec import Executor
from worker.contract.stage_context import StageContext
from worker.models import qwen3_asr, qwen3_omni, qwen3_tts
from worker.stages.base import StageExecutor


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    model_type: str  # the checkpoint config.json's
    make_executor: Callable[[StageContext], StageExecutor]
    # speech: Qwen3-TTS's options (language, instructions) and voices cloned from uploads,
    # whose reference audio reaches the stages at this rate (Hz); None: built-in voices only
    speech_options: bool = False
    voice_rate: int | None = None
    # speech: text streamed in as it is written (the model's streaming-text mode)
    streams_text: bool = False
    # transcription: timed clips with the language the model wrote (segments), and word
    # timestamps where the spec has an aligner stage
    timed_transcripts: bool = False
    # translation: audio in any language to English text (Qwen3-Omni's thinker does it when
    # asked in words; Qwen3-ASR writes what it hears)
    translates: bool = False
    # the module that builds the family's embedded tiny checkpoint from a config folder
    # (``is_tiny(config_dir)``, ``build_checkpoint(config_dir, out, seed)``); imported when a
    # checkpoint is built (it imports transformers' or the family's model classes)
    tiny_builder: str = ""
    # the built-in voices a component's config.json names, where the family names them its own
    # way (None from it: the common keys, ``speaker_id`` / ``spk_id``)
    speakers_of: Callable[[dict], list[str] | None] | None = None


QWEN3_OMNI = Family(
    "Qwen3-Omni",
    qwen3_omni.MODEL_TYPE,
    qwen3_omni.make_executor,
    translates=True,
    tiny_builder="worker.models.qwen3_omni.tiny",
)
QWEN3_TTS = Family(
    "Qwen3-TTS",
    qwen3_tts.MODEL_TYPE,
    qwen3_tts.make_executor,
    speech_options=True,
    voice_rate=qwen3_tts.VOICE_RATE,
    streams_text=True,
    tiny_builder="worker.models.qwen3_tts.tiny",
    speakers_of=qwen3_tts.designed_voices,
)
QWEN3_ASR = Family(
    "Qwen3-ASR",
    qwen3_asr.MODEL_TYPE,
    qwen3_asr.make_executor,
    timed_transcripts=True,
    tiny_builder="worker.models.qwen3_asr.tiny",
)
FAMILIES = {f.model_type: f for f in (QWEN3_OMNI, QWEN3_TTS, QWEN3_ASR)}


def _generic_executor(ctx: StageContext) -> StageExecutor:
    """A plain language model's stage: the generic executor of its executor kind."""
    kind = ctx.stage.executor
    cls: type[StageExecutor]
    if kind == Executor.PREPROCESS:
        from worker.stages.preprocess import PreprocessExecutor as cls
    elif kind == Executor.AUTOREGRESSIVE:
        from worker.stages.autoregressive import LanguageModelExecutor as cls
    elif kind == Executor.DECODE:
        from worker.stages.decode import DecodeExecutor as cls
    elif kind == Executor.AGGREGATE:
        from worker.stages.aggregate import AggregateExecutor as cls
    else:  # encoders and vocoders are model-specific: their family implements them
        raise ValueError(
            f"stage {ctx.name}: a {kind} stage needs a model family under worker/models/ "
            f"({', '.join(f.name for f in FAMILIES.values())}); a plain transformers model "
            "has none"
        )
    return cls(ctx)


# A checkpoint of no family: a plain language model on the generic executors, speaking the
# common surface only (every capability above off)
PLAIN = Family("plain", "", _generic_executor)


@functools.cache
def family_of(model_dir: Path) -> Family:
    """The family of the checkpoint (or config directory) at ``model_dir``; ``PLAIN`` for a
    plain model or where its config.json cannot be read."""
    try:
        model_type = json.loads((model_dir / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return PLAIN
    return FAMILIES.get(model_type, PLAIN)


def make_executor(ctx: StageContext) -> StageExecutor:
    """The executor of one stage, as its family makes it."""
    return family_of(ctx.checkpoint).make_executor(ctx)
