"""Qwen3-TTS-12Hz (``model_type: qwen3_tts``): CustomVoice, VoiceDesign and Base, written for
omni-fleet. (``tts_model_type`` in config.json: CustomVoice speaks built-in speakers, VoiceDesign
the voice its instructions describe, Base clones uploaded voices.)

Its three stages: ``preprocess`` (CPU: the request checked, a cloned voice's reference audio
made ready) -> ``talker`` (the talker on SGLang: ``talker_sglang`` its model class, ``prompt``
its prompts) => ``vocoder`` (the speech tokenizer's decoder, streamed). ``modeling`` holds the
talker, its code predictor and the speaker encoder; ``codec`` the 12 Hz speech tokenizer
(decoder; Mimi encoder for reference codes); ``payloads`` what preprocessing hands the talker.
"""

from __future__ import annotations

from planner.spec import Executor
from worker.contract.stage_context import StageContext
from worker.models.family import Family
from worker.stages.base import StageExecutor

MODEL_TYPE = "qwen3_tts"
VOICE_RATE = 24_000  # Hz: the rate at which a cloned voice's reference audio reaches the stages
VOICE_DESIGN = "voice_design"  # tts_model_type of a VoiceDesign checkpoint
# A VoiceDesign checkpoint's one voice: the one its request's instructions describe (the package's
# generate_voice_design passes no speaker), listed as a built-in voice so that a client that
# must name a voice (OpenAI's SDK) can
DESIGNED_VOICE = "designed"


def designed_voice(config: dict) -> str | None:
    """A VoiceDesign checkpoint's one voice; None for the others."""
    return DESIGNED_VOICE if config.get("tts_model_type") == VOICE_DESIGN else None


def designed_voices(config: dict) -> list[str] | None:
    """A VoiceDesign checkpoint's one voice as its built-in voices; None for the others
    (CustomVoice names its speakers ``spk_id``, as the common keys read them)."""
    designed = designed_voice(config)
    return [designed] if designed else None


def follows_instructions(config: dict) -> bool:
    """Whether a checkpoint's talker follows a request's ``instructions``: the 1.7B CustomVoice
    and VoiceDesign do; the 0.6B and every Base checkpoint do not (the official package drops
    them there: ``generate_custom_voice`` for ``tts_model_size`` 0b6, and ``generate_voice_clone``
    takes none), so the API refuses them there rather than drop them."""
    return config.get("tts_model_size") != "0b6" and config.get("tts_model_type") != "base"


def make_executor(ctx: StageContext) -> StageExecutor:
    kind = ctx.stage.executor
    cls: type[StageExecutor]
    if kind == Executor.PREPROCESS:
        from worker.models.qwen3_tts.preprocess import TTSPreprocess as cls
    elif kind == Executor.AUTOREGRESSIVE:
        from worker.models.qwen3_tts.talker import TalkerExecutor as cls
    elif kind == Executor.VOCODER:
        from worker.models.qwen3_tts.vocoder import TTSVocoderExecutor as cls
    else:
        raise ValueError(
            f"stage {ctx.name}: Qwen3-TTS has no stage for executor {kind}; its stages are "
            "preprocess, autoregressive (the talker) and vocoder (the speech tokenizer's decoder)"
        )
    return cls(ctx)


FAMILY = Family(
    "Qwen3-TTS",
    MODEL_TYPE,
    make_executor,
    speech_options=True,
    voice_rate=VOICE_RATE,
    streams_text=True,
    tiny_builder="worker.models.qwen3_tts.tiny",
    speakers_of=designed_voices,
    designed_voice_of=designed_voice,
    follows_instructions=follows_instructions,
    instructed="the 1.7B CustomVoice and VoiceDesign checkpoints",
)
