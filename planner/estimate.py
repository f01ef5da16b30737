"""Per-stage memory: exact weights, KV cache from the config, documented estimates for the rest.

Everything here is per tensor-parallel rank, in bytes:
* weights: (parameters + persistent buffers) x dtype bytes / tp_size (rounded up);
* KV cache (autoregressive stages): tokens x layers x ceil(kv_heads / tp) x head_dim x 2 x KV
  dtype bytes, where tokens = ``engine.kv_budget_tokens`` or ``max_running_requests x
  context_length``; with a ``memory_share`` the KV cache is what the share leaves over;
* activations + workspace: ``memory.activations_bytes`` of the stage, else the catalog's
  estimate (autoregressive: prefill_chunk_tokens x hidden x dtype bytes x factor + fp32 logits of
  max_running_requests x vocab; encoders/vocoders: a fixed workspace);
* runtime (per process and GPU, outside any share): CUDA context, allocator slack, and CUDA graphs
  for an autoregressive engine of token prompts (``memory.runtime_bytes`` of a stage overrides
  it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from planner.catalog import Estimates, GpuType
from planner.errors import SpecError
from planner.plan import MemoryBudget
from planner.spec import DType, Executor, ModelSpec, StageSpec, resolve_model_dir
from planner.weights import KvLayout, config_path, count_weights, decoder_shape, kv_layout

AUTOREGRESSIVE = Executor.AUTOREGRESSIVE


@dataclass(frozen=True)
class StageFacts:
    """What a stage needs, independent of the GPU it lands on."""

    name: str
    stage: StageSpec
    params: int
    buffers: int
    weight_bytes: int  # whole model (all ranks)
    kv: KvLayout | None
    hidden_size: int
    vocab_size: int

    @property
    def is_engine(self) -> bool:
        return self.stage.executor == AUTOREGRESSIVE

    @property
    def kv_dtype(self) -> DType:
        return self.stage.engine.kv_dtype or (
            DType.BF16 if self.stage.dtype == DType.FP8 else self.stage.dtype
        )

    @property
    def kv_bytes_per_token(self) -> int:
        """Whole model (all ranks together)."""
        return self.kv.bytes_per_token(self.kv_dtype.bytes) if self.kv else 0

    @property
    def kv_bytes_per_token_rank(self) -> int:
        return self.kv.bytes_per_token(self.kv_dtype.bytes, self.stage.tp_size) if self.kv else 0

    @property
    def weight_bytes_rank(self) -> int:
        return math.ceil(self.weight_bytes / self.stage.tp_size)

    @property
    def required_kv_tokens(self) -> int:
        if not self.is_engine:
            return 0
        e = self.stage.engine
        return e.kv_budget_tokens or e.max_running_requests * e.context_length


def stage_facts(spec: ModelSpec, spec_path: Path, name: str) -> StageFacts:
    stage = spec.stages[name]
    comp = stage.component
    if comp is None:
        return StageFacts(name, stage, 0, 0, 0, None, 0, 0)
    model_dir = resolve_model_dir(spec, spec_path)
    try:
        cfg = config_path(model_dir, comp.config_dir)
    except SpecError as exc:
        raise SpecError(f"stages.{name}.component: {exc}") from None
    count = count_weights(cfg, comp.module, tuple(comp.exclude))
    kv = None
    hidden = vocab = 0
    if stage.executor == AUTOREGRESSIVE:
        kv = kv_layout(cfg, comp.module)
        shape = decoder_shape(cfg, comp.module)
        hidden, vocab = shape.hidden_size, shape.vocab_size
        heads = shape.num_attention_heads
        if heads and heads % stage.tp_size:
            raise SpecError(
                f"stages.{name}.tp_size {stage.tp_size} does not divide the {heads} attention "
                f"heads; use one of {[t for t in range(1, heads + 1) if heads % t == 0][:8]}"
            )
        context = stage.engine.context_length
        if shape.max_positions and context > shape.max_positions:
            raise SpecError(
                f"stages.{name}.engine.context_length {context} exceeds the "
                f"{shape.max_positions} positions the checkpoint was trained for "
                f"(max_position_embeddings); use --{name}.engine.context_length "
                f"{shape.max_positions} or less"
            )
        check_kv_dtype(name, stage)
    return StageFacts(
        name=name,
        stage=stage,
        params=count.params,
        buffers=count.buffers,
        weight_bytes=count.elements * stage.dtype.bytes,
        kv=kv,
        hidden_size=hidden,
        vocab_size=vocab,
    )


def check_kv_dtype(name: str, stage: StageSpec) -> None:
    """SGLang keeps a KV cache in the model's own dtype, in bf16, or in fp8 (``kv_cache_dtype``:
    auto, bfloat16, fp8_e4m3); fp8 on a GPU only (a CPU has no fp8 attention)."""
    kv = stage.engine.kv_dtype
    if kv is None or kv == stage.dtype:
        return
    if kv not in (DType.BF16, DType.FP8):
        raise SpecError(
            f"stages.{name}.engine.kv_dtype {kv}: SGLang keeps the KV cache in the model's dtype "
            f"({stage.dtype}), bf16 or fp8; drop the field or use one of those"
        )
    if kv == DType.FP8 and stage.device.value == "cpu":
        raise SpecError(
            f"stages.{name}.engine.kv_dtype fp8 needs a GPU (a CPU stage has no fp8 attention); "
            "use bf16 or drop the field"
        )


def activation_bytes(facts: StageFacts, est: Estimates) -> int:
    stage = facts.stage
    if stage.memory.activations_bytes is not None:
        return stage.memory.activations_bytes
    a = est.activations
    if stage.executor == AUTOREGRESSIVE:
        e = stage.engine
        chunk = e.prefill_chunk_tokens * facts.hidden_size * stage.dtype.bytes
        logits = e.max_running_requests * facts.vocab_size * 4
        return int(chunk * a.autoregressive_factor) + logits
    if stage.executor == Executor.ENCODER:
        return a.encoder_bytes
    if stage.executor == Executor.VOCODER:
        return a.vocoder_bytes
    if stage.executor == Executor.AGGREGATE:
        return a.aggregate_bytes
    return 0


@dataclass(frozen=True)
class StageBudget:
    memory: MemoryBudget  # per rank, without the process runtime
    kv_tokens: int
    share_bytes: int | None = None  # the share's bytes, when the stage declares one


def stage_budget(facts: StageFacts, gpu: GpuType | None) -> StageBudget:
    """Per-rank bytes of one stage on one GPU type (``None``: host memory of a cpu stage)."""
    est = gpu.estimates if gpu is not None else Estimates()
    act = activation_bytes(facts, est) if gpu is not None else 0
    weights = facts.weight_bytes_rank
    share = facts.stage.memory_share
    if gpu is not None and share is not None:
        share_bytes = int(share * gpu.memory_bytes)
        kv = 0
        tokens = 0
        if facts.is_engine:
            left = share_bytes - weights - act
            per = facts.kv_bytes_per_token_rank
            tokens = max(left, 0) // per if per else 0
            if facts.stage.engine.kv_budget_tokens:
                tokens = min(tokens, facts.stage.engine.kv_budget_tokens)
            kv = tokens * per
        # What the weights and the KV pool leave of a stage's share is its workspace: the plan
        # then accounts for the whole share, as the GPU will (the process's allocator cap and
        # the worker's check of free memory take the share whole)
        act = max(act, share_bytes - weights - kv)
        mem = MemoryBudget(weights=weights, kv_cache=kv, activations=act)
        return StageBudget(mem, tokens, share_bytes)
    tokens = facts.required_kv_tokens
    kv = tokens * facts.kv_bytes_per_token_rank
    return StageBudget(MemoryBudget(weights=weights, kv_cache=kv, activations=act), tokens)


def process_runtime(stages: list[StageFacts], gpu: GpuType) -> int:
    """Runtime bytes a process costs on each GPU it uses."""
    own = [f.stage.memory.runtime_bytes for f in stages if f.stage.memory.runtime_bytes is not None]
    if own:
        return max(own)
    est = gpu.estimates
    # captured decode graphs: an engine of token prompts (an embeddings engine runs eagerly,
    # planner.engine_plan)
    captured = any(f.is_engine and f.stage.engine.prompt == "tokens" for f in stages)
    return est.runtime_bytes_per_process + (est.cuda_graph_bytes if captured else 0)
