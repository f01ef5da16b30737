"""Each autoregressive stage's SGLang engine as the plan starts it: its dtype's attention backend,
its KV pool (tokens, and bytes per rank) and every SGLang server argument it is started with.

One function (``sglang_args``) makes the arguments, for the plan that shows them (``omni-plan``,
its ``--json`` and ``explain``) and for the worker that starts SGLang with them
(``worker/engines/sglang/engine.py``, which adds only what a run decides: the model's path, its
load format and the tensor-parallel ranks' meeting port). The KV pool reaches SGLang in bytes and
tokens: the vendor layer (``worker/engines/sglang/patches.py``, ``_kv_pool_from_the_plan``)
sizes SGLang's pool from them instead of SGLang's profile of the GPU's free memory.
"""

from __future__ import annotations

from typing import Any

from planner.catalog import GpuType
from planner.estimate import StageFacts
from planner.plan import EnginePlan
from planner.spec import DType

# SGLang's model dtype for ours (fp8 weights: bf16 activations, SGLang's fp8 quantization)
SGLANG_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16"}
# SGLang's names for the KV cache's dtypes it keeps beside another model dtype
# (``arg_groups/fields/model.py:197-221``): the planner refuses the others
SGLANG_KV_DTYPES = {"bf16": "bfloat16", "fp8": "fp8_e4m3"}


def attention_backend(dtype: DType, gpu: GpuType | None) -> str:
    """SGLang's attention backend for an engine in ``dtype`` on ``gpu`` (None: the CPU).

    On the CPU it is ``torch_native``, under which the vendor layer registers its paged
    attention (``worker/engines/sglang/cpu_attention.py``). On a GPU, an fp32 engine (a tiny
    checkpoint kept in fp32, a reference run) gets ``triton``: SGLang's triton kernels take fp32
    tensors, while the backend SGLang picks itself when none is named (FlashAttention 3 on
    Hopper, ``arg_groups/model_override_base.py``, ``get_default_attn_backend``; FlashInfer;
    TensorRT-LLM's on Blackwell) computes fp16, bf16 or fp8 only. Any other dtype gets the
    GPU type's own (``configs/gpus.yaml``), named, so the plan says what runs."""
    if gpu is None:
        return "torch_native"
    if dtype == DType.FP32:
        return "triton"
    return gpu.attention_backend


def kv_cache_dtype(dtype: DType, kv_dtype: DType | None) -> str:
    """SGLang's ``kv_cache_dtype`` for the KV dtype the planner counts (the spec's
    ``engine.kv_dtype``, else the model's, bf16 under fp8 weights): ``auto`` where it is the
    model's activations' dtype, else bf16 or fp8 beside it."""
    counted = kv_dtype or (DType.BF16 if dtype == DType.FP8 else dtype)
    if SGLANG_DTYPES[counted.value] == SGLANG_DTYPES[dtype.value] and counted != DType.FP8:
        return "auto"
    if counted.value not in SGLANG_KV_DTYPES:
        raise ValueError(f"SGLang keeps no KV cache in {counted}")
    return SGLANG_KV_DTYPES[counted.value]


def sglang_args(
    *,
    dtype: DType,
    kv_dtype: DType | None,
    gpu: bool,
    attention: str | None,
    context_length: int,
    max_running_requests: int,
    kv_tokens: int,
    prefill_chunk_tokens: int,
    prompt: str,
    tp_size: int,
    mem_fraction_static: float | None,
) -> dict[str, Any]:
    """SGLang's server arguments for one engine, in SGLang's names (``ServerArgs`` fields).

    ``prompt`` is the spec's ``engine.prompt``: an ``embeddings`` engine (a talker, whose
    prompts are embeddings and whose forward reads per-request state) runs without SGLang's
    radix cache, CUDA graphs, mixed prefill and grammar. ``mem_fraction_static`` is SGLang's own
    meaning, (weights + KV pool) / the GPU's memory, for SGLang's heuristics that read it; the
    pool itself is the plan's (the vendor layer's ``_kv_pool_from_the_plan``). ``attention``
    None: SGLang's own choice (an engine started outside a plan, on a GPU of no known type)."""
    tokens = prompt == "tokens"
    graphs = gpu and tokens
    args: dict[str, Any] = {
        "device": "cuda" if gpu else "cpu",
        "dtype": SGLANG_DTYPES[dtype.value],
        "kv_cache_dtype": kv_cache_dtype(dtype, kv_dtype),
        "attention_backend": attention,
        # the spec's, which the planner holds within the checkpoint's trained positions
        "context_length": context_length,
        "max_running_requests": max_running_requests,
        # the plan's pool in tokens: the vendor layer sizes SGLang's pool to exactly this, and
        # SGLang's own profile could at most lower it (``_apply_token_constraints``)
        "max_total_tokens": kv_tokens,
        "mem_fraction_static": mem_fraction_static,
        "chunked_prefill_size": prefill_chunk_tokens,
        # a long prompt's chunks in the same forward as the running decodes, which keep
        # streaming while it is prefilled (not for frames: a talker's decode rows)
        "enable_mixed_chunk": tokens,
        # (a talker's token ids are placeholders: nothing to key a prefix cache by)
        "disable_radix_cache": not tokens,
        # CUDA graphs for decode batches up to the running requests (the catalog's
        # cuda_graph_bytes); none on a CPU, none for a forward that reads per-request state
        "disable_cuda_graph": not graphs,
        # prefill graphs (on by default on CUDA in SGLang 0.5.23, cuda_graph_config.py) would
        # hold a pool per captured prefill shape the plan does not count: off, as SGLang-Omni
        # runs them; prefills run eagerly within the stage's activation budget
        "disable_prefill_cuda_graph": True,
        "cuda_graph_max_bs_decode": max_running_requests if graphs else None,
        # constrained decoding over the checkpoint's tokenizer (a talker has none)
        "grammar_backend": "xgrammar" if tokens else "none",
        # no free whitespace in constrained JSON: a reply cannot wander in it to its limit
        "constrained_json_disable_any_whitespace": True,
        # a stage's inputs are token ids (or embeddings) made by the pipeline, not text: no
        # Hugging Face processor in the scheduler (whose video part needs torchvision's C ops)
        "skip_tokenizer_init": True,
        # the stage host steps the scheduler itself, one iteration per step
        "disable_overlap_schedule": True,
        # on every device: flashinfer's sampler takes no per-request seed (sampler.py:404)
        "sampling_backend": "pytorch",
        "random_seed": 0,  # (the engine's own draws; every request carries its seed)
        "log_level": "warning",
    }
    if dtype == DType.FP8:
        args["quantization"] = "fp8"
    if tp_size > 1:
        # (custom all-reduce is for GPUs only)
        args |= {"tp_size": tp_size, "disable_custom_all_reduce": not gpu}
    return args


def engine_plan(f: StageFacts, gpu: GpuType | None, kv_tokens: int) -> EnginePlan:
    """An autoregressive stage's engine on ``gpu`` (None: the CPU) with a pool of ``kv_tokens``:
    what ``omni-plan`` shows and the worker starts."""
    stage = f.stage
    attention = attention_backend(stage.dtype, gpu)
    kv_bytes = kv_tokens * f.kv_bytes_per_token_rank
    fraction = None
    if gpu is not None:
        fraction = round((f.weight_bytes_rank + kv_bytes) / gpu.memory_bytes, 6)
    e = stage.engine
    args = sglang_args(
        dtype=stage.dtype,
        kv_dtype=e.kv_dtype,
        gpu=gpu is not None,
        attention=attention,
        context_length=e.context_length,
        max_running_requests=e.max_running_requests,
        kv_tokens=kv_tokens,
        prefill_chunk_tokens=e.prefill_chunk_tokens,
        prompt=e.prompt,
        tp_size=stage.tp_size,
        mem_fraction_static=fraction,
    )
    return EnginePlan(attention_backend=attention, kv_bytes=kv_bytes, sglang=args)
