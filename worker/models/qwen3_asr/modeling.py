"""Qwen3-ASR, written for omni-fleet: the audio encoder and the Qwen3 text decoder under the
published checkpoint's names (``thinker.audio_tower.*``, ``thinker.model.*``, ``thinker.lm_head``).
Qwen3-ForcedAligner is the same model with a time-slot classifier as ``lm_head`` (``aligner``).

Audio encoder: 128-bin log-mel frames are cut into windows of ``2 * n_window`` frames, each
downsampled 8x by three stride-2 convolutions (GELU), flattened through ``conv_out``, given
sinusoidal positions (restarting in every window), then transformer layers (pre-LayerNorm,
GELU MLP) whose attention stays within blocks of ``n_window_infer`` frames' outputs (8 s: 104
outputs; the model's ``cu_seqlens``), ``ln_post`` and the two-layer projection to the
decoder's width.
Text decoder: Qwen3 layers (q/k RMSNorm, grouped-query attention, SwiGLU); the multimodal rope
of the checkpoint gives every section the same position here, which is plain 1-D rope.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from worker.layers.qwen3_decoder import Decoder, DecoderShape, KVCache


def cnn_output_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """Mel frames -> encoder outputs (13 per full 100-frame window, as the model counts)."""
    rest = lengths % 100
    feat = (rest - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (lengths // 100) * 13


class AudioAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, block: int) -> torch.Tensor:  # (T, D)
        """Bidirectional attention within consecutive blocks of ``block`` positions (the last
        block may be shorter): full blocks as one batch, the rest on its own."""
        t, d = x.shape
        full = t - t % block
        parts = [self._attend(x[:full].view(full // block, block, d))] if full else []
        if full < t:
            parts.append(self._attend(x[full:][None]))
        return self.out_proj(torch.cat([p.reshape(-1, d) for p in parts]))

    def _attend(self, x: torch.Tensor) -> torch.Tensor:  # (B, L, D) -> (B, L, D)
        b, n, d = x.shape
        q, k, v = (
            p(x).view(b, n, self.heads, -1).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)


class AudioLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.self_attn = AudioAttention(dim, heads)
        self.self_attn_layer_norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, ffn)
        self.fc2 = nn.Linear(ffn, dim)
        self.final_layer_norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, block: int) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), block)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


def _sinusoids(length: int, channels: int) -> torch.Tensor:
    inc = np.log(10000) / (channels // 2 - 1)
    inv = torch.exp(-inc * torch.arange(channels // 2, device="cpu").float())
    t = torch.arange(length, device="cpu")[:, None] * inv[None, :]
    return torch.cat([torch.sin(t), torch.cos(t)], dim=1)


class AudioEncoder(nn.Module):
    """``thinker.audio_tower``."""

    positions: torch.Tensor  # a registered buffer (not saved)

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        d = cfg["d_model"]
        h = cfg.get("downsample_hidden_size", 480)
        mels = cfg.get("num_mel_bins", 128)
        self.n_window = cfg.get("n_window", 50)
        self.n_window_infer = cfg.get("n_window_infer", 800)
        self.register_buffer(
            "positions", _sinusoids(cfg.get("max_source_positions", 1500), d), persistent=False
        )
        self.layers = nn.ModuleList(
            AudioLayer(d, cfg["encoder_attention_heads"], cfg["encoder_ffn_dim"])
            for _ in range(cfg["encoder_layers"])
        )
        self.ln_post = nn.LayerNorm(d)
        self.conv2d1 = nn.Conv2d(1, h, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(h, h, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(h, h, 3, 2, padding=1)
        self.conv_out = nn.Linear(h * ((((mels + 1) // 2 + 1) // 2 + 1) // 2), d, bias=False)
        self.proj1 = nn.Linear(d, d)
        self.proj2 = nn.Linear(d, cfg["output_dim"])

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """One clip's log-mel (mels, frames) -> (outputs, output_dim)."""
        frames = features.shape[1]
        win = self.n_window * 2
        sizes = [win] * (frames // win) + ([frames % win] if frames % win else [])
        chunks = list(features.T.split(sizes, dim=0))
        padded = nn.utils.rnn.pad_sequence(chunks, batch_first=True).transpose(1, 2)[:, None]
        x = F.gelu(self.conv2d1(padded))
        x = F.gelu(self.conv2d2(x))
        x = F.gelu(self.conv2d3(x))
        b, c, f, t = x.shape
        x = self.conv_out(x.permute(0, 3, 1, 2).reshape(b, t, c * f))
        x = x + self.positions[:t].to(x.device, x.dtype)[None]
        keep = cnn_output_lengths(torch.tensor(sizes))
        x = torch.cat([x[i, : int(n)] for i, n in enumerate(keep)], dim=0)
        # The model sizes attention blocks from the longest window's outputs (13 once a clip
        # holds a full window), times the windows per block.
        block = int(keep.max()) * (self.n_window_infer // win)
        for layer in self.layers:
            x = layer(x, block)
        return self.proj2(F.gelu(self.proj1(self.ln_post(x))))


class TextModel(Decoder):
    """``thinker.model``: Qwen3 layers + ``embed_tokens``."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(DecoderShape.of(cfg))
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])


class Thinker(nn.Module):
    def __init__(self, cfg: dict[str, Any], tie: bool) -> None:
        super().__init__()
        tc = cfg["text_config"]
        self.audio_tower = AudioEncoder(cfg["audio_config"])
        self.model = TextModel(tc)
        # Qwen3-ForcedAligner: the head classifies positions into time slots, not tokens
        aligner = "forced_aligner" in str(cfg.get("model_type", ""))
        out = cfg["classify_num"] if aligner else tc["vocab_size"]
        tie = tie and not aligner
        self.lm_head = None if tie else nn.Linear(tc["hidden_size"], out, bias=False)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            return h @ self.model.embed_tokens.weight.T
        return self.lm_head(h)


class Qwen3ASRModel(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        tc = config["thinker_config"]
        tie = bool(tc["text_config"].get("tie_word_embeddings", config.get("tie_word_embeddings")))
        self.thinker = Thinker(tc, tie)


def greedy(
    model: Qwen3ASRModel, input_ids: list[int], features: torch.Tensor, max_new: int, eos: set[int]
) -> list[int]:
    """One clip's transcript tokens, greedy (the audio placeholders filled with the encoder's
    outputs)."""
    th = model.thinker
    tc = model.config["thinker_config"]
    ids = torch.tensor([input_ids])
    with torch.inference_mode():
        x = th.model.embed_tokens(ids)
        audio = th.audio_tower(features)
        mask = ids[0] == tc["audio_token_id"]
        if int(mask.sum()) != audio.shape[0]:
            raise ValueError(f"{int(mask.sum())} audio placeholders for {audio.shape[0]} outputs")
        x[0, mask] = audio.to(x.dtype)
        cache = KVCache.empty(th.model.s.num_layers)
        h = th.model.prefill(x, cache)[:, -1]
        out: list[int] = []
        while len(out) < max_new:
            tok = int(th.logits(h).argmax(-1))
            out.append(tok)
            if tok in eos:
                break
            h = th.model.step(th.model.embed_tokens(torch.tensor([[tok]])), [cache])[:, -1]
    return out


__all__ = ["AudioEncoder", "Qwen3ASRModel", "cnn_output_lengths", "greedy", "math"]
