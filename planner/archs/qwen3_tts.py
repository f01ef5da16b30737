"""Qwen3-TTS, described explicitly: transformers 5.24 has no ``qwen3_tts`` model type.

The module tree below mirrors the official ``qwen-tts`` package (module names included) using
transformers' building blocks, so that parameter counts are exact:

``Qwen3TTSForConditionalGeneration``
  ``talker``: a Qwen3-style decoder over codec tokens
    ``model.codec_embedding`` (vocab_size x hidden), ``model.layers`` (Qwen3 decoder layers),
    ``model.norm``, ``model.text_embedding`` (text_vocab_size x text_hidden_size);
    ``text_projection``: fc1 text_hidden->text_hidden, fc2 text_hidden->hidden (with biases);
    ``codec_head``: hidden -> vocab_size (no bias);
    ``code_predictor``: a small Qwen3 decoder predicting codebooks 2..G of each frame:
      ``model.layers``/``model.norm``, ``model.codec_embedding`` (G-1 tables of
      code_vocab x talker hidden), ``lm_head`` (G-1 heads code_hidden -> code_vocab),
      ``small_to_mtp_projection`` (talker hidden -> code hidden, only when they differ).
  ``speaker_encoder`` (Base variants only): ECAPA-TDNN, transformers' Qwen2.5-Omni
    ``ECAPA_TimeDelayNet`` with the qwen-tts defaults.

``Qwen3TTSTokenizerV2Model`` (``speech_tokenizer/``, a Mimi-style codec, stored in FP32)
  ``encoder``: transformers' ``MimiModel`` (encoder side + its split RVQ) without the decoder;
  ``decoder``: pre-transformer (code2wav-style layers with layer scale, plus input/output
    projections latent_dim <-> hidden), split RVQ with **parameter** codebooks (cluster_usage,
    embedding_sum) and 1x1 projections, pre_conv, upsampling (transposed conv + ConvNeXt) and
    the SnakeBeta decoder blocks of Qwen3-Omni's code2wav.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from planner.archs import MetaModel
from planner.errors import ArchitectureError

_QWEN3_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "attention_bias",
    "max_position_embeddings", "rope_theta",
)  # fmt: skip


def _need(cfg: dict[str, Any], *keys: str, where: str) -> None:
    missing = [k for k in keys if k not in cfg]
    if missing:
        raise ArchitectureError(f"qwen3_tts {where}: missing {missing}")


def _qwen3_config(cfg: dict[str, Any], vocab_size: int):
    from transformers import Qwen3Config

    kwargs = {k: cfg[k] for k in _QWEN3_KEYS if k in cfg}
    kwargs["vocab_size"] = vocab_size
    return Qwen3Config(tie_word_embeddings=False, **kwargs)


class _Decoder(nn.Module):
    """A Qwen3 decoder stack whose token embedding is named like qwen-tts names it."""

    def __init__(self, cfg: dict[str, Any], vocab_size: int) -> None:
        from transformers import Qwen3Model

        super().__init__()
        self.config = _qwen3_config(cfg, vocab_size)
        inner = Qwen3Model(self.config)
        self.layers = inner.layers
        self.norm = inner.norm
        self.rotary_emb = inner.rotary_emb


class _TextProjection(nn.Module):
    def __init__(self, text_hidden: int, hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.act_fn = nn.SiLU()
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)


class _CodePredictor(nn.Module):
    def __init__(self, cp: dict[str, Any], talker_hidden: int) -> None:
        super().__init__()
        _need(cp, "hidden_size", "num_hidden_layers", "vocab_size", "num_code_groups",
              where="code_predictor_config")  # fmt: skip
        groups = cp["num_code_groups"] - 1
        self.model = _Decoder(cp, cp["vocab_size"])
        self.config = self.model.config
        self.model.codec_embedding = nn.ModuleList(
            nn.Embedding(cp["vocab_size"], talker_hidden) for _ in range(groups)
        )
        self.lm_head = nn.ModuleList(
            nn.Linear(cp["hidden_size"], cp["vocab_size"], bias=False) for _ in range(groups)
        )
        self.small_to_mtp_projection = (
            nn.Linear(talker_hidden, cp["hidden_size"], bias=True)
            if talker_hidden != cp["hidden_size"]
            else nn.Identity()
        )


class _Talker(nn.Module):
    def __init__(self, tc: dict[str, Any]) -> None:
        super().__init__()
        _need(tc, "hidden_size", "num_hidden_layers", "vocab_size", "text_vocab_size",
              "text_hidden_size", "code_predictor_config", where="talker_config")  # fmt: skip
        hidden = tc["hidden_size"]
        self.model = _Decoder(tc, tc["vocab_size"])
        self.config = self.model.config  # the decoder that holds the KV cache
        self.model.codec_embedding = nn.Embedding(tc["vocab_size"], hidden)
        self.model.text_embedding = nn.Embedding(tc["text_vocab_size"], tc["text_hidden_size"])
        self.text_projection = _TextProjection(tc["text_hidden_size"], hidden)
        self.codec_head = nn.Linear(hidden, tc["vocab_size"], bias=False)
        self.code_predictor = _CodePredictor(tc["code_predictor_config"], hidden)


def _speaker_encoder(sc: dict[str, Any]) -> nn.Module:
    from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniDiTConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import ECAPA_TimeDelayNet

    # qwen-tts' Qwen3TTSSpeakerEncoderConfig defaults (differ from Qwen2.5-Omni's DiT ones).
    params: dict[str, Any] = {
        "mel_dim": 128, "enc_dim": 1024, "enc_channels": [512, 512, 512, 512, 1536],
        "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1],
        "enc_attention_channels": 128, "enc_res2net_scale": 8, "enc_se_channels": 128,
    }  # fmt: skip
    params.update({k: v for k, v in sc.items() if k in params})
    return ECAPA_TimeDelayNet(Qwen2_5OmniDiTConfig(**params))


class Qwen3TTSModel(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        if "talker_config" not in config:
            raise ArchitectureError("qwen3_tts: config.json has no talker_config")
        self.talker = _Talker(config["talker_config"])
        self.config = self.talker.config  # the KV cache belongs to the talker's decoder
        if config.get("tts_model_type", "base") == "base":
            self.speaker_encoder = _speaker_encoder(config.get("speaker_encoder_config") or {})


def build_tts(config: dict[str, Any]) -> MetaModel:
    with torch.device("meta"):
        model = Qwen3TTSModel(config)
    return MetaModel(model=model, model_type="qwen3_tts", builder="explicit:qwen3_tts")


class _SplitRVQ(nn.Module):
    """Decoder-side split residual VQ: codebooks are parameters in the qwen-tts checkpoint."""

    def __init__(self, n_q: int, bins: int, codebook_dim: int) -> None:
        super().__init__()
        dim = codebook_dim // 2
        self.rvq_first = self._rvq(1, bins, dim, codebook_dim)
        self.rvq_rest = self._rvq(n_q - 1, bins, dim, codebook_dim)

    @staticmethod
    def _rvq(n_q: int, bins: int, dim: int, io_dim: int) -> nn.Module:
        rvq = nn.Module()
        rvq.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        rvq.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        rvq.vq = nn.Module()
        layers = []
        for _ in range(n_q):
            layer = nn.Module()
            layer._codebook = nn.Module()
            layer._codebook.cluster_usage = nn.Parameter(torch.empty(bins))
            layer._codebook.embedding_sum = nn.Parameter(torch.empty(bins, dim))
            layers.append(layer)
        rvq.vq.layers = nn.ModuleList(layers)
        return rvq


class _TokenizerDecoder(nn.Module):
    def __init__(self, dc: dict[str, Any]) -> None:
        from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as omni
        from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
            Qwen3OmniMoeCode2WavConfig,
        )

        super().__init__()
        required = ("latent_dim", "hidden_size", "codebook_dim", "codebook_size", "num_quantizers",
                    "decoder_dim", "upsample_rates", "upsampling_ratios")  # fmt: skip
        _need(dc, *required, where="decoder_config")
        keys = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "sliding_window",
                "num_hidden_layers", "rms_norm_eps", "hidden_act", "attention_bias",
                "layer_scale_initial_scale", "max_position_embeddings", "codebook_size",
                "num_quantizers", "decoder_dim", "upsample_rates", "upsampling_ratios")  # fmt: skip
        common = {k: dc[k] for k in keys if k in dc}
        tcfg = Qwen3OmniMoeCode2WavConfig(hidden_size=dc["hidden_size"], **common)
        if "head_dim" in dc:
            tcfg.head_dim = dc["head_dim"]
        self.pre_transformer = omni.Qwen3OmniMoeCode2WavTransformerModel(tcfg)
        self.pre_transformer.input_proj = nn.Linear(dc["latent_dim"], dc["hidden_size"])
        self.pre_transformer.output_proj = nn.Linear(dc["hidden_size"], dc["latent_dim"])
        self.quantizer = _SplitRVQ(dc["num_quantizers"], dc["codebook_size"], dc["codebook_dim"])
        latent = dc["latent_dim"]
        self.pre_conv = omni.Qwen3OmniMoeCausalConvNet(dc["codebook_dim"], latent, 3)
        # Upsampling and the SnakeBeta decoder are Qwen3-Omni's code2wav blocks at latent_dim.
        ucfg = Qwen3OmniMoeCode2WavConfig(hidden_size=latent, **common)
        self.upsample = nn.ModuleList(
            nn.ModuleList(
                [
                    omni.Qwen3OmniMoeCausalTransConvNet(latent, latent, factor, factor),
                    omni.Qwen3OmniMoeConvNeXtBlock(latent),
                ]
            )
            for factor in dc["upsampling_ratios"]
        )
        decoder: list[nn.Module] = [omni.Qwen3OmniMoeCausalConvNet(latent, dc["decoder_dim"], 7)]
        decoder += [
            omni.Qwen3OmniMoeCode2WavDecoderBlock(ucfg, i) for i in range(len(dc["upsample_rates"]))
        ]
        out_dim = dc["decoder_dim"] // 2 ** len(dc["upsample_rates"])
        decoder += [
            omni.Qwen3OmniMoeSnakeBeta(out_dim),
            omni.Qwen3OmniMoeCausalConvNet(out_dim, 1, 7),
        ]
        self.decoder = nn.ModuleList(decoder)


def _tokenizer_encoder(ec: dict[str, Any]) -> nn.Module:
    from transformers import MimiConfig, MimiModel

    fields = (
        set(MimiConfig.__dataclass_fields__)
        if hasattr(MimiConfig, "__dataclass_fields__")
        else None
    )
    kwargs = {k: v for k, v in ec.items() if not k.startswith("_") and k != "transformers_version"}
    if fields is not None:
        kwargs = {k: v for k, v in kwargs.items() if k in fields}
    if "_frame_rate" in ec:
        kwargs["frame_rate"] = ec["_frame_rate"]
    model = MimiModel(MimiConfig(**kwargs))
    # The tokenizer's encoder keeps Mimi's encoder side only; its decoder is the one below.
    for name in ("decoder", "decoder_transformer", "upsample"):
        if hasattr(model, name):
            delattr(model, name)
    return model


class Qwen3TTSTokenizerModel(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        for key in ("encoder_config", "decoder_config"):
            if key not in config:
                raise ArchitectureError(f"qwen3_tts_tokenizer_12hz: config.json has no {key}")
        self.encoder = _tokenizer_encoder(config["encoder_config"])
        self.decoder = _TokenizerDecoder(config["decoder_config"])


def build_speech_tokenizer(config: dict[str, Any]) -> MetaModel:
    with torch.device("meta"):
        model = Qwen3TTSTokenizerModel(config)
    return MetaModel(
        model=model, model_type="qwen3_tts_tokenizer_12hz", builder="explicit:qwen3_tts"
    )
