"""Qwen3-TTS-12Hz's talker, code predictor and speaker encoder, written for omni-fleet.

The module tree uses the published checkpoint's names (``talker.model.layers.N.self_attn.q_proj``,
``talker.code_predictor.lm_head.J``, ``speaker_encoder.blocks.N``...), so the official
``model.safetensors`` loads into it with a strict key check. The computation follows the
model's definition: the shared Qwen3 decoder (worker/layers/qwen3_decoder.py) with the
talker's embeddings and heads. The talker's multimodal rope gives every section the same
position for speech, which is plain 1-D rope; it is computed that way here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from worker.layers.qwen3_decoder import Decoder, DecoderShape, FusedDecoder, rope_cos_sin


class ResizeMLP(nn.Module):
    """``text_projection``: text embeddings -> talker width (fc1, silu, fc2, with biases)."""

    def __init__(self, inp: int, inter: int, out: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(inp, inter, bias=True)
        self.linear_fc2 = nn.Linear(inter, out, bias=True)

    def forward(self, x):
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerModel(Decoder):
    """``talker.model``: the decoder plus the codec and text embeddings."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__(DecoderShape.of(cfg))
        self.codec_embedding = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.text_embedding = nn.Embedding(cfg["text_vocab_size"], cfg["text_hidden_size"])


class CodePredictorModel(Decoder):
    def __init__(self, cfg: dict[str, Any], embedding_dim: int) -> None:
        super().__init__(DecoderShape.of(cfg))
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg["vocab_size"], embedding_dim)
            for _ in range(cfg["num_code_groups"] - 1)
        )


class CodePredictor(nn.Module):
    """``talker.code_predictor``: given the talker's last hidden state and a frame's first
    code, the frame's other code groups, one after the other (greedy)."""

    def __init__(self, cfg: dict[str, Any], talker_hidden: int) -> None:
        super().__init__()
        self.groups = cfg["num_code_groups"]
        self.model = CodePredictorModel(cfg, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
            for _ in range(self.groups - 1)
        )
        self._fused: FusedDecoder | None = None
        self.small_to_mtp_projection: nn.Linear | None = None
        if cfg["hidden_size"] != talker_hidden:
            self.small_to_mtp_projection = nn.Linear(talker_hidden, cfg["hidden_size"], bias=True)

    def _proj(self, x):
        return x if self.small_to_mtp_projection is None else self.small_to_mtp_projection(x)

    def predict(
        self,
        hidden: torch.Tensor,
        first_embed: torch.Tensor,
        choose: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """hidden, first_embed: (B, 1, talker_hidden) -> codes (B, groups - 1), each pass's
        code chosen from its logits (B, vocab) by ``choose`` (None: greedy). All B requests
        have the same length here, so the batch needs no padding."""
        m = self.model
        if self._fused is None:  # (built on first use: after the weights are loaded and placed)
            self._fused = FusedDecoder(m)
        b = hidden.shape[0]
        x = self._proj(torch.cat([hidden, first_embed], dim=1))
        caches = [[None, None] for _ in range(m.s.num_layers)]
        # the rope of every position a frame's passes take, computed once: (B, 1, T, head_dim)
        pos = torch.arange(self.groups + 1, device=x.device)[None].expand(b, -1)
        cos_all, sin_all = (
            r[:, None] for r in rope_cos_sin(pos, m.s.head_dim, m.s.rope_theta, x.dtype)
        )
        h = self._fused.run(x, cos_all[:, :, :2], sin_all[:, :, :2], caches)[:, -1:]
        out = []
        for j in range(self.groups - 1):
            logits = self.lm_head[j](h[:, -1])
            code = logits.argmax(-1) if choose is None else choose(logits)
            out.append(code)
            if j == self.groups - 2:
                break
            x = self._proj(m.codec_embedding[j](code)[:, None])
            at = slice(2 + j, 3 + j)
            h = self._fused.run(x, cos_all[:, :, at], sin_all[:, :, at], caches)
        return torch.stack(out, dim=1)


class Talker(nn.Module):
    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = TalkerModel(cfg)
        self.text_projection = ResizeMLP(
            cfg["text_hidden_size"], cfg["text_hidden_size"], cfg["hidden_size"]
        )
        self.codec_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        self.code_predictor = CodePredictor(cfg["code_predictor_config"], cfg["hidden_size"])

    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.text_projection(self.model.text_embedding(ids))

    def codec_embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.codec_embedding(ids)

    def frame_embed(self, frame: torch.Tensor) -> torch.Tensor:
        """Sum of a frame's code-group embeddings: frame (B, groups) -> (B, 1, H)."""
        x = self.model.codec_embedding(frame[:, 0])
        for j, emb in enumerate(self.code_predictor.model.codec_embedding):
            x = x + emb(frame[:, j + 1])
        return x[:, None]


# ---- speaker encoder (ECAPA-TDNN), Base checkpoints only ------------------------------------


class TDNNBlock(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(
            cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect"
        )

    def forward(self, x):
        return F.relu(self.conv(x))


class Res2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(
            TDNNBlock(cin // scale, cout // scale, kernel, dilation) for _ in range(scale - 1)
        )

    def forward(self, x):
        parts = torch.chunk(x, self.scale, dim=1)
        outs = [parts[0]]
        for i in range(1, self.scale):
            # Each split after the first also takes the previous split's output.
            outs.append(self.blocks[i - 1](parts[i] if i == 1 else parts[i] + outs[-1]))
        return torch.cat(outs, dim=1)


def _conv1(cin: int, cout: int) -> nn.Conv1d:
    return nn.Conv1d(cin, cout, 1, padding="same", padding_mode="reflect")


class SEBlock(nn.Module):
    def __init__(self, cin: int, se: int, cout: int) -> None:
        super().__init__()
        self.conv1 = _conv1(cin, se)
        self.conv2 = _conv1(se, cout)

    def forward(self, x):
        s = x.mean(dim=2, keepdim=True)
        return x * torch.sigmoid(self.conv2(F.relu(self.conv1(s))))


class SERes2NetBlock(nn.Module):
    def __init__(self, cin, cout, scale, se, kernel, dilation) -> None:
        super().__init__()
        self.tdnn1 = TDNNBlock(cin, cout, 1, 1)
        self.res2net_block = Res2NetBlock(cout, cout, scale, kernel, dilation)
        self.tdnn2 = TDNNBlock(cout, cout, 1, 1)
        self.se_block = SEBlock(cout, se, cout)

    def forward(self, x):
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


class AttentiveStatsPool(nn.Module):
    def __init__(self, channels: int, attention: int) -> None:
        super().__init__()
        self.tdnn = TDNNBlock(channels * 3, attention, 1, 1)
        self.conv = _conv1(attention, channels)

    @staticmethod
    def _stats(x, w):
        mean = (w * x).sum(2)
        std = torch.sqrt((w * (x - mean[..., None]).pow(2)).sum(2).clamp(1e-12))
        return mean, std

    def forward(self, x):
        t = x.shape[-1]
        w = torch.full_like(x[:, :1], 1.0 / t)
        mean, std = self._stats(x, w)
        ctx = torch.cat([x, mean[..., None].expand(-1, -1, t), std[..., None].expand(-1, -1, t)], 1)
        att = F.softmax(self.conv(torch.tanh(self.tdnn(ctx))), dim=2)
        mean, std = self._stats(x, att)
        return torch.cat([mean, std], dim=1)[..., None]


class SpeakerEncoder(nn.Module):
    """``speaker_encoder``: 128-bin log-mel frames -> one x-vector of the talker's width."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        ch = cfg.get("enc_channels", [512, 512, 512, 512, 1536])
        ks = cfg.get("enc_kernel_sizes", [5, 3, 3, 3, 1])
        dil = cfg.get("enc_dilations", [1, 2, 3, 4, 1])
        scale = cfg.get("enc_res2net_scale", 8)
        se = cfg.get("enc_se_channels", 128)
        self.blocks = nn.ModuleList([TDNNBlock(cfg.get("mel_dim", 128), ch[0], ks[0], dil[0])])
        for i in range(1, len(ch) - 1):
            self.blocks.append(SERes2NetBlock(ch[i - 1], ch[i], scale, se, ks[i], dil[i]))
        self.mfa = TDNNBlock(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatsPool(ch[-1], cfg.get("enc_attention_channels", 128))
        self.fc = _conv1(ch[-1] * 2, cfg.get("enc_dim", 1024))

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """mels (B, frames, 128) -> (B, enc_dim)."""
        x = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            x = block(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)


_MEL_CACHE: dict[tuple, torch.Tensor] = {}


def speaker_mel(wav: torch.Tensor) -> torch.Tensor:
    """The speaker encoder's input: 24 kHz mono (T,) -> log-mel (1, frames, 128): n_fft 1024,
    hop 256, Hann window, reflect padding of (n_fft - hop) / 2 on each side, magnitude with a
    1e-9 floor, Slaney-normalised mel filters on 0..12 kHz, natural log clipped at 1e-5."""
    from transformers.audio_utils import mel_filter_bank

    n_fft, hop, sr, n_mels = 1024, 256, 24000, 128
    key = (n_fft, n_mels, sr)
    if key not in _MEL_CACHE:
        fb = mel_filter_bank(
            num_frequency_bins=n_fft // 2 + 1,
            num_mel_filters=n_mels,
            min_frequency=0.0,
            max_frequency=12000.0,
            sampling_rate=sr,
            norm="slaney",
            mel_scale="slaney",
        )
        _MEL_CACHE[key] = torch.from_numpy(fb.T).float()
    basis = _MEL_CACHE[key].to(wav.device)
    pad = (n_fft - hop) // 2
    y = F.pad(wav.float()[None, None], (pad, pad), mode="reflect")[0]
    spec = torch.stft(
        y,
        n_fft,
        hop_length=hop,
        win_length=n_fft,
        window=torch.hann_window(n_fft, device=wav.device),
        center=False,
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    mel = torch.log(torch.clamp(basis @ mag, min=1e-5))
    return mel.transpose(1, 2)


class Qwen3TTSModel(nn.Module):
    """The root of ``model.safetensors``: ``talker`` and, on Base, ``speaker_encoder``."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        self.talker = Talker(config["talker_config"])
        self.speaker_encoder: SpeakerEncoder | None = None
        if config.get("tts_model_type") == "base":
            self.speaker_encoder = SpeakerEncoder(config.get("speaker_encoder_config") or {})
