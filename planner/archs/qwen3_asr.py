"""Qwen3-ASR: map the official nested config onto transformers' ``Qwen3ASRConfig``.

The official checkpoint nests everything under ``thinker_config.{audio_config,text_config}``;
transformers 5.24 expects ``audio_config``/``text_config`` at the top level, ignores the nesting
and builds its 2.04 B defaults. Here the nested sub-configs are passed explicitly, which gives
the exact 782,426,112 parameters of Qwen3-ASR-0.6B (as the official ``qwen-asr`` package
counts). A config that is already flat (the transformers-native layout) is built unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

from planner.archs import MetaModel, build_transformers
from planner.errors import ArchitectureError

# model_type spellings of the official checkpoint -> transformers 5.24's registered name.
_AUDIO_TYPES = {"qwen3_asr_audio_encoder": "qwen3_asr_encoder"}
_THINKER_KEYS = ("audio_token_id", "initializer_range", "timestamp_token_id", "pad_token_id")


def build_asr(config: dict[str, Any]) -> MetaModel:
    thinker = config.get("thinker_config")
    if thinker is None:
        return build_transformers(config)
    from transformers import (
        Qwen3ASRConfig,
        Qwen3ASRForConditionalGeneration,
        Qwen3ASRForTokenClassification,
    )

    try:
        audio = dict(thinker["audio_config"])
        text = dict(thinker["text_config"])
    except (KeyError, TypeError):
        raise ArchitectureError(
            "qwen3_asr: thinker_config must hold both audio_config and text_config"
        ) from None
    audio["model_type"] = _AUDIO_TYPES.get(audio.get("model_type", ""), "qwen3_asr_encoder")
    text.setdefault("model_type", "qwen3")
    extra = {k: thinker[k] for k in _THINKER_KEYS if k in thinker}
    tie = text.get("tie_word_embeddings", True)
    aligner = thinker.get("model_type") == "qwen3_forced_aligner"
    if aligner:
        # The forced aligner replaces the LM head with a bias-free classify_num-way timestamp
        # classifier over the decoder's hidden states.
        if "classify_num" not in thinker:
            raise ArchitectureError("qwen3_forced_aligner: thinker_config has no classify_num")
        extra.update(num_labels=thinker["classify_num"], token_classification_bias=False)
    cfg = Qwen3ASRConfig(audio_config=audio, text_config=text, tie_word_embeddings=tie, **extra)
    # Guard against the silent-default failure this module exists for.
    got = (
        getattr(cfg.audio_config, "d_model", None),
        getattr(cfg.text_config, "hidden_size", None),
    )
    want = (audio.get("d_model"), text.get("hidden_size"))
    if got != want:
        raise ArchitectureError(f"qwen3_asr: sub-configs were not applied (got {got}, want {want})")
    cls = Qwen3ASRForTokenClassification if aligner else Qwen3ASRForConditionalGeneration
    with torch.device("meta"):
        model = cls(cfg)
    return MetaModel(model=model, model_type="qwen3_asr", builder="explicit:qwen3_asr")
