"""Qwen3-TTS-Tokenizer-12Hz, written for omni-fleet: the decoder (16 code groups per 80 ms frame
-> 24 kHz audio) and the encoder (audio -> reference codes for voice cloning).

Names follow the published ``speech_tokenizer/model.safetensors`` (``decoder.quantizer.rvq_first``,
``decoder.pre_transformer.layers.N``, ``decoder.upsample.I.J``, ``decoder.decoder.N.block.M``...).
The decoder is causal end to end (left-padded convolutions, transposed convolutions trimmed on
the right, sliding-window attention), so a stream decodes in chunks with left context.
The encoder is Mimi (transformers' ``MimiModel``, as the published tokenizer's encoder is),
without Mimi's own decoder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from worker.layers.qwen3_decoder import RMSNorm, rope_cos_sin


class CausalConv(nn.Module):
    def __init__(self, cin, cout, kernel, dilation=1, stride=1, groups=1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.kernel = (kernel - 1) * dilation + 1
        self.padding = self.kernel - stride

    def forward(self, x):
        length = x.shape[-1]
        frames = (length - self.kernel + self.padding) / self.stride + 1
        ideal = (math.ceil(frames) - 1) * self.stride + (self.kernel - self.padding)
        return self.conv(F.pad(x, (self.padding, ideal - length)))


class CausalTransConv(nn.Module):
    def __init__(self, cin, cout, kernel, stride) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.trim = kernel - stride

    def forward(self, x):
        x = self.conv(x)
        return x[..., : x.shape[-1] - self.trim] if self.trim > 0 else x


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x):
        h = self.dwconv(x).transpose(1, 2)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class SnakeBeta(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        alpha = torch.exp(self.alpha)[None, :, None]
        beta = torch.exp(self.beta)[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x):
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int) -> None:
        super().__init__()
        units = [SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate)]
        units += [ResidualUnit(cout, d) for d in (1, 3, 9)]
        self.block = nn.ModuleList(units)

    def forward(self, x):
        for m in self.block:
            x = m(x)
        return x


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def table(self) -> torch.Tensor:
        return self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class _VQ(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = Codebook(size, dim)


class _RVQLayers(nn.Module):
    def __init__(self, n: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_VQ(size, dim) for _ in range(n))

    def tables(self) -> list[torch.Tensor]:
        """Each layer's codebook vectors, in layer order."""
        tables = []
        for vq in self.layers:
            assert isinstance(vq, _VQ)  # ModuleList yields plain Modules; it only holds _VQs
            tables.append(vq._codebook.table())
        return tables


class RVQ(nn.Module):
    def __init__(self, n: int, size: int, dim: int, io_dim: int) -> None:
        super().__init__()
        self.vq = _RVQLayers(n, size, dim)
        self.input_proj = nn.Conv1d(
            io_dim, dim, 1, bias=False
        )  # encoding only; kept for the layout
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (B, n, T) -> (B, io_dim, T)."""
        tables = self.vq.tables()
        total = F.embedding(codes[:, 0], tables[0])
        for i, table in enumerate(tables[1:], start=1):
            total = total + F.embedding(codes[:, i], table)
        return self.output_proj(total.transpose(1, 2))


class SplitRVQ(nn.Module):
    def __init__(self, n: int, size: int, codebook_dim: int) -> None:
        super().__init__()
        self.rvq_first = RVQ(1, size, codebook_dim // 2, codebook_dim)
        self.rvq_rest = RVQ(n - 1, size, codebook_dim // 2, codebook_dim)

    def decode(self, codes):
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


class TransformerLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        from worker.layers.qwen3_decoder import MLP, Attention, DecoderShape

        shape = DecoderShape.of(cfg)
        self.self_attn = Attention(shape, qk_norm=False, bias=cfg.get("attention_bias", False))
        self.mlp = MLP(cfg["hidden_size"], cfg["intermediate_size"])
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-5))
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-5))
        self.self_attn_layer_scale = _Scale(cfg["hidden_size"])
        self.mlp_layer_scale = _Scale(cfg["hidden_size"])

    def forward(self, x, cos, sin, mask, cache=None):
        x = x + self.self_attn_layer_scale.scale * self.self_attn(
            self.input_layernorm(x), cos, sin, mask, cache
        )
        return x + self.mlp_layer_scale.scale * self.mlp(self.post_attention_layernorm(x))


class _Scale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))


class PreTransformer(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-5))
        self.input_proj = nn.Linear(cfg["latent_dim"], cfg["hidden_size"])
        self.output_proj = nn.Linear(cfg["hidden_size"], cfg["latent_dim"])
        heads = cfg["num_attention_heads"]
        self.head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads

    def forward(self, x):  # (B, T, latent)
        return self.step(x, self.fresh())

    def fresh(self) -> _Window:
        return _Window([[None, None] for _ in self.layers])

    def step(self, x: torch.Tensor, state: _Window) -> torch.Tensor:
        """The next frames ``(B, T, latent)`` of a sequence whose earlier frames' keys and
        values ``state`` holds (at most the window's; ``fresh()``: none): causal attention
        within the sliding window, a query seeing itself and the window - 1 keys before it."""
        x = self.input_proj(x)
        t = x.shape[1]
        past = 0 if state.layers[0][0] is None else int(state.layers[0][0].shape[2])
        pos = torch.arange(state.position, state.position + t, device=x.device)
        cos, sin = rope_cos_sin(
            pos[None], self.head_dim, float(self.cfg.get("rope_theta", 1e4)), x.dtype
        )
        keys = torch.arange(state.position - past, state.position + t, device=x.device)
        dist = pos[:, None] - keys[None, :]
        window = int(self.cfg.get("sliding_window") or 0) or state.position + t + 1
        allowed = (dist >= 0) & (dist < window)
        mask = torch.zeros(t, past + t, dtype=x.dtype, device=x.device)
        mask.masked_fill_(~allowed, torch.finfo(x.dtype).min)
        for layer, cache in zip(self.layers, state.layers, strict=True):
            x = layer(x, cos, sin, mask[None, None], cache)
            drop = cache[0].shape[2] - (window - 1)  # what no later frame sees
            if drop > 0:
                cache[0], cache[1] = cache[0][:, :, drop:], cache[1][:, :, drop:]
        state.position += t
        return self.output_proj(self.norm(x))


@dataclass(slots=True)
class _Window:
    """A sequence's keys and values per layer (``[k, v]``, ``(B, kv heads, frames, dim)``),
    at most the sliding window's last ones, and how many frames it has had."""

    layers: list[list[Any]]
    position: int = 0


class SpeechDecoder(nn.Module):
    """``decoder``: codes (B, 16, T) -> waveform (B, 1, T * 1920) in [-1, 1]."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_quantizers = cfg["num_quantizers"]
        self.total_upsample = int(
            np.prod(list(cfg["upsample_rates"]) + list(cfg["upsampling_ratios"]))
        )
        self.pre_transformer = PreTransformer(cfg)
        self.quantizer = SplitRVQ(cfg["num_quantizers"], cfg["codebook_size"], cfg["codebook_dim"])
        self.pre_conv = CausalConv(cfg["codebook_dim"], cfg["latent_dim"], 3)
        latent = cfg["latent_dim"]
        # Sequential: the same ``upsample.I.J`` names as a list of lists, applied in order
        self.upsample = nn.ModuleList(
            nn.Sequential(CausalTransConv(latent, latent, f, f), ConvNeXtBlock(latent))
            for f in cfg["upsampling_ratios"]
        )
        dim = cfg["decoder_dim"]
        blocks: list[nn.Module] = [CausalConv(latent, dim, 7)]
        for i, rate in enumerate(cfg["upsample_rates"]):
            blocks.append(DecoderBlock(dim // 2**i, dim // 2 ** (i + 1), rate))
        out_dim = dim // 2 ** len(cfg["upsample_rates"])
        blocks += [SnakeBeta(out_dim), CausalConv(out_dim, 1, 7)]
        self.decoder = nn.ModuleList(blocks)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        h = self.quantizer.decode(codes)
        h = self.pre_conv(h).transpose(1, 2)
        h = self.pre_transformer(h).transpose(1, 2)
        for blocks in self.upsample:
            h = blocks(h)
        for block in self.decoder:
            h = block(h)
        return h.clamp(-1, 1)

    def streamed(self) -> tuple[_StreamFront, list[nn.Module]]:
        """What ``worker.layers.streamed_vocoder`` streams: the frame-rate part (codebooks,
        the causal pre-convolution, the transformer) and the convolutional layers after it,
        in order."""
        return _StreamFront(self), [*self.upsample, *self.decoder]

    def chunked(
        self, codes: torch.Tensor, chunk: int = 300, left_context: int = 25
    ) -> torch.Tensor:
        """Long code sequences in chunks, each with up to ``left_context`` frames before it
        (the model's own whole-utterance decode)."""
        out, start, total = [], 0, codes.shape[-1]
        while start < total:
            end = min(start + chunk, total)
            ctx = left_context if start - left_context > 0 else start
            wav = self(codes[..., start - ctx : end])
            out.append(wav[..., ctx * self.total_upsample :])
            start = end
        return torch.cat(out, dim=-1)


class _StreamFront:
    """``SpeechDecoder.forward`` up to its convolutions, a few frames at a time: the codebooks
    per frame, the pre-convolution with its last inputs kept, the transformer with its keys
    and values (``PreTransformer.step``)."""

    def __init__(self, decoder: SpeechDecoder) -> None:
        from worker.layers.streamed_vocoder import ConvPart

        self.decoder = decoder
        self.pre_conv = ConvPart([decoder.pre_conv])

    def fresh(self) -> tuple[list[Any], _Window]:
        return self.pre_conv.fresh(), self.decoder.pre_transformer.fresh()

    def __call__(self, codes: torch.Tensor, state: tuple[list[Any], _Window]) -> torch.Tensor:
        d = self.decoder
        h = self.pre_conv(d.quantizer.decode(codes), state[0]).transpose(1, 2)
        return d.pre_transformer.step(h, state[1]).transpose(1, 2)


class SpeechTokenizer(nn.Module):
    """The root of ``speech_tokenizer/model.safetensors``: ``decoder`` and (optionally)
    ``encoder`` (Mimi)."""

    def __init__(
        self, config: dict[str, Any], with_encoder: bool, with_decoder: bool = True
    ) -> None:
        super().__init__()
        self.config = config
        self.decoder = SpeechDecoder(config["decoder_config"]) if with_decoder else None
        self.encoder = _mimi_encoder(config["encoder_config"]) if with_encoder else None
        self.valid_quantizers = int(config.get("encoder_valid_num_quantizers", 16))
        self.downsample = int(config.get("encode_downsample_rate", 1920))
        self.upsample = int(config.get("decode_upsample_rate", 1920))

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (T, groups) of one utterance -> float waveform (T * 1920,)."""
        if self.decoder is None:
            raise RuntimeError("this speech tokenizer was loaded without its decoder")
        wav = self.decoder.chunked(codes.T[None].clamp(min=0))
        return wav[0, 0, : codes.shape[0] * self.upsample]

    @torch.inference_mode()
    def encode(self, wav: torch.Tensor) -> torch.Tensor:
        """24 kHz mono (T,) -> reference codes (ceil(T / 1920), groups)."""
        if self.encoder is None:
            raise RuntimeError("this speech tokenizer was loaded without its encoder")
        dtype = next(self.encoder.parameters()).dtype
        out = self.encoder.encode(wav.to(dtype)[None, None], return_dict=True)
        codes = out.audio_codes[0, : self.valid_quantizers]
        frames = -(-wav.shape[0] // self.downsample)
        return codes[:, :frames].T


def _mimi_encoder(cfg: dict[str, Any]):
    from transformers import MimiConfig, MimiModel

    config = MimiConfig(
        **{k: v for k, v in cfg.items() if not k.startswith("_") or k == "_frame_rate"}
    )
    model = MimiModel(config)
    model.decoder = None  # the published tokenizer keeps Mimi's encoder half only
    return model


def mimi_name(name: str) -> str:
    """A Mimi tensor name as transformers 4.57 wrote it -> transformers 5's module name
    (the encoder's SEANet, transformer and downsampling moved under ``encoder.``)."""
    for old, new in (
        ("encoder.layers.", "encoder.encoder_seanet.layers."),
        ("encoder_transformer.", "encoder.encoder_transformer."),
        ("downsample.", "encoder.downsample."),
    ):
        if name.startswith(old):
            return new + name[len(old) :]
    return name
