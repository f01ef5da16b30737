"""The decoder stack on a CPU: SGLang's layers' weights and KV pool, without its per-layer
machinery.

On a GPU host, CUDA graphs replay a decode step's kernels without running SGLang's Python
again; what remains per step is the kernels. A CPU has no such graphs (SGLang's
``cpu_graph_runner.py`` compiles the decode forward, but only beside ``sgl_kernel``'s AMX
attention), so every step runs the Python of SGLang 0.5.23's layers, which is built for the
many parallel layouts a GPU cluster needs: per layer, the stage boundaries' residual stream
(``layers/layer_boundary/``: ``StageBoundary.prepare``/``finish``, ``residual/stream.py``),
the fused-op dispatch of every norm, rope and activation (``kernels/fused_op.py:633``), the
MoE's dispatcher/combiner and, without ``sgl_kernel``, its per-expert loop with a host copy
(``layers/moe/fused_moe_native.py:61-160``), q/k norms and rope op by op
(``models/qwen3_moe.py:649-740``). On two cores that was three quarters of a decode step of
the tiny thinker (3.1 of 4.1 ms).

Here the same math runs as one plain loop over the model's layers: RMS norms
(``torch.nn.functional.rms_norm``), the fused qkv projection, the q and k norms over all heads
at once, the rotary embedding gathered once per forward (not per layer) and applied to queries
and keys together, the paged attention backend's one call per layer (``cpu_attention``), the
MoE as two grouped matrix multiplies over the tokens sorted by expert (``torch._grouped_mm``,
fp32 and bf16 on torch's CPU build) after SGLang's top-k routing, a dense MLP as gate-up,
SiLU-and-mul, down. Under tensor parallelism each layer's two row-parallel outputs are summed
across ranks, as SGLang's boundaries sum them.

What each layer reads is gathered once per model (``_plan``: the layers' own parameter
tensors, the q/k norm weights laid out per head), as a CUDA graph capture keeps its tensors'
addresses: the weights are loaded before the first forward and not replaced afterwards.

It replaces the body of the model classes the families run (``Qwen2Model.forward``,
``Qwen3Model.forward``, ``Qwen2MoeModel.forward``, ``Qwen3MoeLLMModel.forward``), on this
project's CPU platform only, and only for a model all of whose parts it knows (``_plan``:
unquantized linears, softmax top-k, standard or 3-D neox rope, q/k norms, no sliding window,
no pipeline stages); any other keeps SGLang's own forward. ``tests/test_cpu_stack.py`` checks
it equal to SGLang's own path (fp32).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

_REFERENCE = False  # set by ``sglang_path``: SGLang's own forward, for checks


@contextmanager
def sglang_path() -> Any:
    """Within it, every model runs SGLang's own forward (what the stack is checked against)."""
    global _REFERENCE
    before, _REFERENCE = _REFERENCE, True
    try:
        yield
    finally:
        _REFERENCE = before


def replacing(sglang_forward: Callable[..., Any], body: Callable[..., Any]) -> Callable[..., Any]:
    """A model class's forward: ``body`` where the stack runs the model, else SGLang's."""
    from sglang.srt.model_executor.forward_context import get_attn_backend

    from worker.engines.sglang.cpu_attention import PagedAttention

    def forward(self: Any, input_ids: Any, positions: Any, forward_batch: Any,
                *args: Any, **kwargs: Any) -> Any:  # fmt: skip
        backend = get_attn_backend()
        plan = None if _REFERENCE or not isinstance(backend, PagedAttention) else _plan(self)
        if plan is None:
            return sglang_forward(self, input_ids, positions, forward_batch, *args, **kwargs)
        return body(self, plan, backend, input_ids, positions, forward_batch, *args, **kwargs)

    forward.__wrapped__ = sglang_forward  # type: ignore[attr-defined]
    return forward


# ---- the model bodies --------------------------------------------------------------------
def plain_body(
    model: Any,
    plan: _Stack,
    backend: Any,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    forward_batch: Any,
    input_embeds: torch.Tensor | None = None,
    pp_proxy_tensors: Any = None,
) -> Any:
    """``Qwen2Model.forward`` / ``Qwen3Model.forward`` / ``Qwen2MoeModel.forward``
    (``models/qwen2.py:434-498``, ``models/qwen3.py:506-541``,
    ``models/qwen2_moe.py:1159-1215``): embeddings, the layers, the final norm; the layers
    marked for capture give their input as an auxiliary hidden state."""
    x = model.embed_tokens(input_ids) if input_embeds is None else input_embeds
    capture = set(getattr(model, "layers_to_capture", ()) or ())
    capture |= {i for i, layer in enumerate(model.layers)
                if getattr(layer, "_is_layer_to_capture", False)}  # fmt: skip
    out, aux = plan.run(backend, forward_batch, positions, x, capture)
    return (out, aux) if aux else out


def deepstack_body(
    model: Any,
    plan: _Stack,
    backend: Any,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    forward_batch: Any,
    input_embeds: torch.Tensor | None = None,
    pp_proxy_tensors: Any = None,
    input_deepstack_embeds: torch.Tensor | None = None,
) -> Any:
    """``Qwen3MoeLLMModel.forward`` (``models/qwen3_vl_moe.py:85-168``, the Qwen3-Omni
    thinker's text model) in its inference order: the vision encoder's deepstack features are
    added to the output of the first layers."""
    if model.use_hf_deepstack_order:
        raise NotImplementedError("the CPU stack follows the inference deepstack order")
    x = model.embed_tokens(input_ids) if input_embeds is None else input_embeds
    deepstack = None
    if input_deepstack_embeds is not None:
        width = model.hidden_size
        deepstack = {
            i: input_deepstack_embeds[:, i * width : (i + 1) * width]
            for i in model.deepstack_embed_to_decoder_layer
        }
    out, aux = plan.run(backend, forward_batch, positions, x, set(model.layers_to_capture or ()),
                        deepstack)  # fmt: skip
    return (out, aux) if aux else out


# ---- the stack ---------------------------------------------------------------------------
@dataclass(slots=True)
class _Dense:
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        gate_up = F.linear(h, self.gate_up, self.gate_up_bias)
        half = gate_up.shape[-1] // 2
        return F.linear(F.silu(gate_up[:, :half]) * gate_up[:, half:], self.down, self.down_bias)


@dataclass(slots=True)
class _Moe:
    """Top-k routing as SGLang's native path (``layers/moe/topk.py:1098-1145``: softmax in
    fp32, top k, renormalized when the config says), then the experts as two grouped matrix
    multiplies over the (token, choice) pairs sorted by expert, each pair's output weighted in
    fp32 and summed per token, as ``moe_forward_native`` combines them
    (``layers/moe/fused_moe_native.py:150-160``); Qwen2-MoE's shared expert under its sigmoid
    gate beside them."""

    gate: torch.Tensor
    top_k: int
    renormalize: bool
    w13: torch.Tensor  # (experts, hidden, 2 x intermediate): gate then up, as grouped_mm takes
    w2: torch.Tensor  # (experts, intermediate, hidden)
    shared: _Dense | None
    shared_gate: torch.Tensor | None

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        from sglang.srt.layers.moe.topk import _RENORMALIZE_SUM_EPSILON

        logits = F.linear(h, self.gate)
        probs = (logits if logits.dtype == torch.float32 else logits.float()).softmax(dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + _RENORMALIZE_SUM_EPSILON)
        if h.shape[0] == 1:
            out = self._one_token(h, weights[0], ids[0])
        else:
            out = self._grouped(h, weights, ids)
        if self.shared is not None and self.shared_gate is not None:
            out = out + self.shared(h) * torch.sigmoid(F.linear(h, self.shared_gate))
        return out

    def _one_token(self, h: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """One token (a decode step of one request): its k experts one after another, in the
        order of their ids as the grouped path sums them. A grouped multiply visits every
        expert, chosen or not (on this CPU 73 us a layer for 4 experts, 311 us for 128 with 8
        chosen; this 44 and 123 us), and reading k ids on the host costs nothing on a CPU."""
        out = None
        half = self.w13.shape[-1] // 2
        for expert, weight in sorted(zip(ids.tolist(), weights.tolist(), strict=True)):
            gate_up = torch.mm(h, self.w13[expert])
            y = torch.mm(F.silu(gate_up[:, :half]) * gate_up[:, half:], self.w2[expert])
            y = y.float() * weight  # (not add_'s alpha: a fused multiply-add rounds once)
            out = y if out is None else out.add_(y)
        assert out is not None
        return out.to(h.dtype)

    def _grouped(self, h: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.view(-1)
        order = flat.argsort(stable=True)
        ends = torch.bincount(flat, minlength=self.w13.shape[0]).cumsum(0, dtype=torch.int32)
        rows = order // self.top_k  # the token of each pair
        gate_up = torch._grouped_mm(h.index_select(0, rows), self.w13, offs=ends)
        half = gate_up.shape[-1] // 2
        pairs = torch._grouped_mm(F.silu(gate_up[:, :half]) * gate_up[:, half:], self.w2,
                                  offs=ends)  # fmt: skip
        weighted = weights.view(-1).index_select(0, order)[:, None]  # (fp32)
        if h.dtype == torch.float32:
            return torch.zeros_like(h).index_add_(0, rows, pairs * weighted)
        out = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
        return out.index_add_(0, rows, pairs.float() * weighted).to(h.dtype)


@dataclass(slots=True)
class _Layer:
    norm_in: torch.Tensor
    norm_post: torch.Tensor
    eps: float
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    heads: int
    kv_heads: int
    head_dim: int
    qk_norm: torch.Tensor  # (heads + kv heads, head dim): the q norm's weight, then the k's
    qk_eps: float
    attn: Any  # SGLang's RadixAttention (its layer id, scaling, head counts)
    o: torch.Tensor
    o_bias: torch.Tensor | None
    ffn: _Dense | _Moe


@dataclass(slots=True)
class _Stack:
    layers: list[_Layer]
    first: int  # the index of the first layer (pipeline stages: always 0 here)
    rope: Any  # SGLang's rotary embedding module, shared by the layers
    norm: torch.Tensor
    eps: float
    tp: bool  # several tensor-parallel ranks: the row-parallel outputs are summed

    def run(
        self,
        backend: Any,
        forward_batch: Any,
        positions: torch.Tensor,
        x: torch.Tensor,
        capture: set[int],
        deepstack: dict[int, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The layers over the residual stream ``x`` (a layer adds its attention's output,
        then its MLP's, as SGLang's boundaries add them), then the final norm. ``aux``: the
        input of each layer in ``capture``."""
        aux: list[torch.Tensor] = []
        if x.shape[0] == 0:
            return x, aux
        cos, sin = _rope_tables(self.rope, positions, x.dtype)
        half = self.rope.rotary_dim // 2
        attend = backend.attend
        reduce = _all_reduce if self.tp else None
        for i, layer in enumerate(self.layers, start=self.first):
            if i in capture:
                aux.append(x.clone())
            h = F.rms_norm(x, (x.shape[-1],), layer.norm_in, layer.eps)
            qkv = F.linear(h, layer.qkv, layer.qkv_bias)
            q_and_k = (layer.heads + layer.kv_heads) * layer.head_dim
            qk = qkv[:, :q_and_k].view(-1, layer.heads + layer.kv_heads, layer.head_dim)
            qk = F.rms_norm(qk, (layer.head_dim,), None, layer.qk_eps) * layer.qk_norm
            # neox rotation of both halves: x * cos + (second half, first half) * (-sin, sin)
            qk = qk * cos + torch.cat((qk[..., half:], qk[..., :half]), dim=-1) * sin
            v = qkv[:, q_and_k:].view(-1, layer.kv_heads, layer.head_dim)
            o = attend(qk[:, : layer.heads], qk[:, layer.heads :], v, layer.attn, forward_batch)
            o = F.linear(o, layer.o, layer.o_bias)
            x = x + (o if reduce is None else reduce(o))
            h = F.rms_norm(x, (x.shape[-1],), layer.norm_post, layer.eps)
            out = layer.ffn(h)
            if reduce is not None:
                out = reduce(out)
            if deepstack is not None and i in deepstack:
                out = out + deepstack[i]
            x = x + out
        return F.rms_norm(x, (x.shape[-1],), self.norm, self.eps), aux


def _rope_tables(rope: Any, positions: torch.Tensor, dtype: torch.dtype) -> tuple[Any, Any]:
    """The rotary embedding's cos and sin at ``positions``, laid out for a neox rotation of
    ``(tokens, heads, dim)``: ``(cos, cos)`` and ``(-sin, sin)``, ``(tokens, 1, dim)``. For
    3-D positions (temporal, height, width) each section's positions are picked as
    ``MRotaryEmbedding.forward_native`` picks them (``layers/rotary_embedding/mrope.py:
    196-212``); the products are ``apply_rotary_emb``'s (``rotary_embedding/utils.py:36-62``).
    """
    table = rope.cos_sin_cache.index_select(0, positions.reshape(-1))
    cos, sin = table.view(*positions.shape, -1).chunk(2, dim=-1)
    if positions.ndim == 2:
        from sglang.srt.layers.rotary_embedding.mrope import apply_interleaved_rope

        if rope.mrope_interleaved:
            cos = apply_interleaved_rope(cos, rope.mrope_section)
            sin = apply_interleaved_rope(sin, rope.mrope_section)
        else:
            cos = torch.cat([p[i] for i, p in enumerate(cos.split(rope.mrope_section, -1))], -1)
            sin = torch.cat([p[i] for i, p in enumerate(sin.split(rope.mrope_section, -1))], -1)
    cos = torch.cat((cos, cos), dim=-1)[:, None].to(dtype)
    sin = torch.cat((-sin, sin), dim=-1)[:, None].to(dtype)
    return cos, sin


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    from sglang.srt.distributed.communication_op import tensor_model_parallel_all_reduce

    return tensor_model_parallel_all_reduce(t)


# ---- what the stack runs -----------------------------------------------------------------
def _plan(model: Any) -> _Stack | None:
    """The stack of ``model`` (made on its first forward and kept), or None where a part of
    it is one the stack does not run (then SGLang's forward runs it; ``why_not`` says why)."""
    plan = model.__dict__.get("_cpu_stack", False)
    if plan is False:
        plan = _build(model) if why_not(model) is None else None
        model._cpu_stack = plan
    return plan


def _build(model: Any) -> _Stack:
    from sglang.srt.distributed.parallel_state import get_tensor_model_parallel_world_size

    layers = [_layer(layer) for layer in model.layers[model.start_layer : model.end_layer]]
    return _Stack(layers, model.start_layer, model.layers[model.start_layer].self_attn.rotary_emb,
                  model.norm.weight, model.norm.variance_epsilon,
                  get_tensor_model_parallel_world_size() > 1)  # fmt: skip


def _layer(layer: Any) -> _Layer:
    a = layer.self_attn
    qk_norm = torch.cat([a.q_norm.weight.expand(a.num_heads, -1),
                         a.k_norm.weight.expand(a.num_kv_heads, -1)])  # fmt: skip
    return _Layer(
        norm_in=layer.input_layernorm.weight,
        norm_post=layer.post_attention_layernorm.weight,
        eps=layer.input_layernorm.variance_epsilon,
        qkv=a.qkv_proj.weight,
        qkv_bias=a.qkv_proj.bias,
        heads=a.num_heads,
        kv_heads=a.num_kv_heads,
        head_dim=a.head_dim,
        qk_norm=qk_norm,
        qk_eps=a.q_norm.variance_epsilon,
        attn=a.attn,
        o=a.o_proj.weight,
        o_bias=a.o_proj.bias,
        ffn=_ffn(layer.mlp),
    )


def _dense(mlp: Any) -> _Dense:
    return _Dense(mlp.gate_up_proj.weight, mlp.gate_up_proj.bias, mlp.down_proj.weight,
                  mlp.down_proj.bias)  # fmt: skip


def _ffn(mlp: Any) -> _Dense | _Moe:
    experts = getattr(mlp, "experts", None)
    if experts is None:
        return _dense(mlp)
    shared = getattr(mlp, "shared_expert", None)
    cfg = mlp.topk.topk_config
    return _Moe(
        gate=mlp.gate.weight,
        top_k=cfg.top_k,
        renormalize=cfg.renormalize,
        w13=experts.w13_weight.transpose(1, 2),
        w2=experts.w2_weight.transpose(1, 2),
        shared=None if shared is None else _dense(shared),
        shared_gate=None if shared is None else mlp.shared_expert_gate.weight,
    )


def why_not(model: Any) -> str | None:
    """What of ``model`` the stack does not run (None: it runs all of it)."""
    from sglang.srt.layers.quantization.unquant import (
        UnquantizedFusedMoEMethod,
        UnquantizedLinearMethod,
    )
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding
    from sglang.srt.layers.rotary_embedding.mrope import MRotaryEmbedding

    pp = getattr(model, "pp_group", None)
    if pp is not None and not (pp.is_first_rank and pp.is_last_rank):
        return "pipeline stages"
    layers = list(model.layers[model.start_layer : model.end_layer])
    if not layers:
        return "no layers"
    if len({id(layer.self_attn.rotary_emb) for layer in layers}) != 1:
        return "a rotary embedding per layer"
    rope = layers[0].self_attn.rotary_emb
    if type(rope) not in (RotaryEmbedding, MRotaryEmbedding) or not rope.is_neox_style:
        return f"the rotary embedding {type(rope).__name__}"
    if rope.rotary_dim != rope.head_size:
        return "a partial rotary embedding"
    for layer in layers:
        a = layer.self_attn
        if not hasattr(a, "q_norm") or a.attn.sliding_window_size not in (None, -1):
            return "attention without q/k norms, or a sliding window"
        if a.q_norm.variance_epsilon != a.k_norm.variance_epsilon:
            return "q and k norms of different epsilons"
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if norms[0].variance_epsilon != norms[1].variance_epsilon:
            return "layer norms of different epsilons"
        linears = [a.qkv_proj, a.o_proj]
        mlp = layer.mlp
        experts = getattr(mlp, "experts", None)
        if experts is None:
            if type(mlp.act_fn).__name__ != "SiluAndMul":
                return "an MLP activation other than SiLU"
            linears += [mlp.gate_up_proj, mlp.down_proj]
        else:
            cfg = mlp.topk.topk_config
            runner = experts.moe_runner_config
            if (
                cfg.use_grouped_topk
                or cfg.custom_routing_function is not None
                or cfg.correction_bias is not None
                or cfg.scoring_func != "softmax"
                or cfg.routed_scaling_factor not in (None, 1.0)
                or cfg.num_shared_topk_slots
                or runner.activation != "silu"
                or runner.apply_router_weight_on_input
                or getattr(experts, "w13_weight_bias", None) is not None
                or getattr(experts, "w2_weight_bias", None) is not None
                or type(experts.quant_method) is not UnquantizedFusedMoEMethod
                or experts.w13_weight.shape[0] != mlp.gate.weight.shape[0]
            ):
                return "a MoE other than softmax top-k over unquantized SiLU experts"
            linears.append(mlp.gate)
            if getattr(mlp, "shared_expert", None) is not None:
                linears += [mlp.shared_expert.gate_up_proj, mlp.shared_expert.down_proj]
        if any(not isinstance(m.quant_method, UnquantizedLinearMethod) for m in linears):
            return "quantized linears"
    return None
