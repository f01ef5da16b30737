"""The Qwen3 decoder as the families here use it: RMSNorm, rope, grouped-query attention with a
q/k norm per head, SwiGLU, a stack of layers over a per-request KV cache; and seeded weights for
the embedded tiny checkpoints.

Qwen3-TTS's talker and code predictor and Qwen3-ASR's text decoder (and its forced aligner) are
this decoder with their own heads (worker/models/qwen3_tts/modeling.py, qwen3_asr/modeling.py).
Decoding keeps one KV cache per request (``KVCache``) so that requests of different lengths
step together: a batched step left-pads the caches to the longest one and masks the padding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3's RMSNorm: in fp32, then the weight times it in the input's dtype."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        # one op, bit for bit the steps below on fp32 (tests/test_worker_units.py)
        return F.rms_norm(x, weight.shape, weight, eps)
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype) -> tuple:
    """cos/sin of shape (B, T, head_dim) for integer positions (B, T)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[..., None] * inv.to(positions.device)[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


@dataclass
class DecoderShape:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float

    @classmethod
    def of(cls, cfg: dict[str, Any]) -> DecoderShape:
        heads = cfg["num_attention_heads"]
        return cls(
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(cfg.get("rope_theta", 10000.0)),
        )


class Attention(nn.Module):
    def __init__(self, s: DecoderShape, qk_norm: bool = True, bias: bool = False) -> None:
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(s.hidden_size, s.num_heads * s.head_dim, bias=bias)
        self.k_proj = nn.Linear(s.hidden_size, s.num_kv_heads * s.head_dim, bias=bias)
        self.v_proj = nn.Linear(s.hidden_size, s.num_kv_heads * s.head_dim, bias=bias)
        self.o_proj = nn.Linear(s.num_heads * s.head_dim, s.hidden_size, bias=bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if qk_norm:
            self.q_norm = RMSNorm(s.head_dim, s.rms_norm_eps)
            self.k_norm = RMSNorm(s.head_dim, s.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache: list | None):
        """x (B, T, H); cache: [k, v] of this layer (B, kvh, S, d) or None; mask (B, 1, T, S+T)
        additive or None (causal over T, no past)."""
        b, t, _ = x.shape
        s = self.s
        q = self.q_proj(x).view(b, t, s.num_heads, s.head_dim)
        k = self.k_proj(x).view(b, t, s.num_kv_heads, s.head_dim)
        v = self.v_proj(x).view(b, t, s.num_kv_heads, s.head_dim).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q.transpose(1, 2), cos, sin), apply_rope(k.transpose(1, 2), cos, sin)
        if cache is not None:
            if cache[0] is not None:
                k = torch.cat([cache[0], k], dim=2)
                v = torch.cat([cache[1], v], dim=2)
            cache[0], cache[1] = k, v
        rep = s.num_heads // s.num_kv_heads
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, s: DecoderShape) -> None:
        super().__init__()
        self.self_attn = Attention(s)
        self.mlp = MLP(s.hidden_size, s.intermediate_size)
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


@dataclass
class KVCache:
    """One request's keys and values: per layer [k, v] of shape (1, kvh, S, d)."""

    layers: list[list[Any]] = field(default_factory=list)

    @classmethod
    def empty(cls, n: int) -> KVCache:
        return cls([[None, None] for _ in range(n)])

    @property
    def length(self) -> int:
        k = self.layers[0][0] if self.layers else None
        return 0 if k is None else int(k.shape[2])


class Decoder(nn.Module):
    """Stack of Qwen3 decoder layers + final norm (``layers``, ``norm``)."""

    def __init__(self, s: DecoderShape) -> None:
        super().__init__()
        self.s = s
        self.layers = nn.ModuleList(DecoderLayer(s) for _ in range(s.num_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)

    def prefill(self, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One request's prompt (1, T, H) into an empty cache; returns hidden states."""
        t = x.shape[1]
        pos = torch.arange(t, device=x.device)[None]
        cos, sin = rope_cos_sin(pos, self.s.head_dim, self.s.rope_theta, x.dtype)
        for layer, c in zip(self.layers, cache.layers, strict=True):
            x = layer(x, cos, sin, None, c)
        return self.norm(x)

    def step(self, x: torch.Tensor, caches: list[KVCache]) -> torch.Tensor:
        """One new position for each of B requests (B, 1, H), each with its own cache."""
        b = x.shape[0]
        lens = [c.length for c in caches]
        longest = max(lens)
        pos = torch.tensor(lens, device=x.device)[:, None]
        cos, sin = rope_cos_sin(pos, self.s.head_dim, self.s.rope_theta, x.dtype)
        if b == 1:
            mask = None
            for layer, layer_cache in zip(self.layers, caches[0].layers, strict=True):
                x = layer(x, cos, sin, mask, layer_cache)
            return self.norm(x)
        # Left-pad every cache to the longest, attend over padding + own keys + the new one.
        keep = torch.zeros(b, 1, 1, longest + 1, dtype=x.dtype, device=x.device)
        for i, n in enumerate(lens):
            keep[i, ..., : longest - n] = torch.finfo(x.dtype).min
        for li, layer in enumerate(self.layers):
            ks, vs = [], []
            for c, n in zip(caches, lens, strict=True):
                k, v = c.layers[li]
                if n < longest:
                    pad = (0, 0, longest - n, 0)
                    k, v = F.pad(k, pad), F.pad(v, pad)
                ks.append(k)
                vs.append(v)
            batch_cache = [torch.cat(ks), torch.cat(vs)]
            x = layer(x, cos, sin, keep, batch_cache)
            for i, (c, n) in enumerate(zip(caches, lens, strict=True)):
                c.layers[li][0] = batch_cache[0][i : i + 1, :, longest - n :]
                c.layers[li][1] = batch_cache[1][i : i + 1, :, longest - n :]
        return self.norm(x)


def _fuse(*linears: nn.Linear) -> torch.Tensor:
    """The linears' weights as one matrix, each linear's weight then a view of its rows: no
    second copy of them is held (the planner counts each weight once)."""
    fused = torch.cat([lin.weight.detach() for lin in linears])
    row = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight = nn.Parameter(fused[row : row + n], requires_grad=False)
        row += n
    return fused


class FusedDecoder:
    """A ``Decoder``'s layers for many short passes, inference only: each layer's q/k/v and
    gate/up projections one matmul each over weights concatenated once, the norms one op, no
    module calls. A code predictor makes 15 passes of one position per frame; at the sizes that
    run on a CPU such a pass is mostly per-op overhead, and this takes a quarter to a third off
    it (docs/omni-worker.md, "Speed"). The same arithmetic as the layers' ``forward``: the codes
    and waveforms equal the official package's (tests/models/test_qwen3_tts_reference.py).
    Built once the weights are loaded and placed; the projections' weights become views of
    the fused matrices."""

    def __init__(self, decoder: Decoder) -> None:
        self.s = decoder.s
        self.layers: list[tuple[torch.Tensor, ...]] = []
        for layer in cast("list[DecoderLayer]", list(decoder.layers)):
            a, mlp = layer.self_attn, layer.mlp
            if a.q_norm is None or a.k_norm is None or a.q_proj.bias is not None:
                raise ValueError("FusedDecoder takes Qwen3 layers: q/k norms, no biases")
            qkv = _fuse(a.q_proj, a.k_proj, a.v_proj)
            gate_up = _fuse(mlp.gate_proj, mlp.up_proj)
            self.layers.append((
                layer.input_layernorm.weight.detach(), qkv, a.q_norm.weight.detach(),
                a.k_norm.weight.detach(), a.o_proj.weight.detach(),
                layer.post_attention_layernorm.weight.detach(), gate_up,
                mlp.down_proj.weight.detach(),
            ))  # fmt: skip
        self.norm = decoder.norm.weight.detach()

    def run(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, caches: list
    ) -> torch.Tensor:
        """x (B, T, H) after ``caches`` (per layer [k, v] or [None, None], extended in place);
        cos/sin (B, 1, T, head_dim). Causal over T. -> the final norm's output."""
        s, eps = self.s, self.s.rms_norm_eps
        b, t, _ = x.shape
        nh, nkv, hd = s.num_heads, s.num_kv_heads, s.head_dim
        half = hd // 2
        for (w_in, w_qkv, w_qn, w_kn, w_o, w_post, w_gu, w_down), cache in zip(
            self.layers, caches, strict=True
        ):
            q, k, v = F.linear(rms_norm(x, w_in, eps), w_qkv).split(
                [nh * hd, nkv * hd, nkv * hd], -1
            )
            q = rms_norm(q.view(b, t, nh, hd), w_qn, eps).transpose(1, 2)
            k = rms_norm(k.view(b, t, nkv, hd), w_kn, eps).transpose(1, 2)
            v = v.view(b, t, nkv, hd).transpose(1, 2)
            # rope, as apply_rope: x * cos + rotate_half(x) * sin
            q = q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin
            k = k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin
            if cache[0] is not None:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[0], cache[1] = k, v
            out = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1, enable_gqa=nh != nkv)
            x = x + F.linear(out.transpose(1, 2).reshape(b, t, -1), w_o)
            gate, up = F.linear(rms_norm(x, w_post, eps), w_gu).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w_down)
        return rms_norm(x, self.norm, eps)


def init_random(module: nn.Module, seed: int, std: float = 0.02) -> None:
    """Seeded weights for the embedded tiny checkpoints: normal(std) for matrices, ones plus
    noise for norms and scales, noise for biases."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            elif name.endswith(("norm.weight", "layernorm.weight")):
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * std)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
