"""Every patch of SGLang, each with why it exists and the SGLang lines (0.5.23) it works around.

``before_import`` runs before the first ``import sglang`` of a process; ``after_import`` right
after it. Each patch says when it can go.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any


def before_import() -> None:
    _absent_helpers_for_sglang_imports(install=True)


def after_import() -> None:
    _absent_helpers_for_sglang_imports(install=False)
    _kv_pool_from_the_plan()
    _per_request_seeds()
    _repetition_penalty_over_the_prompt()
    _seeded_draws_in_vocabulary_order()
    _seeded_sampling_without_sgl_kernel()
    _cpu_attention()
    _cpu_decoder_stack()


# What SGLang imports at start, for helpers the stages here never run, and a CPU host does not
# install (pyproject.toml [tool.uv] exclude-dependencies):
_ABSENT_ON_CPU = {
    # ``utils.py:25`` (``from IPython.display import HTML, display``, reached from
    # ``sglang/__init__.py`` -> ``lang.api``): used only by ``print_highlight``, a notebook
    # helper
    "IPython": ("IPython.display",),
    # ``configs/__init__.py`` -> ``configs/nano_nemotron_vl.py:22`` ->
    # ``multimodal/internvl_utils.py:5,7``, and -> ``configs/unlimited_ocr.py:16`` ->
    # ``configs/deepseek_ocr.py:7-8``: image transforms called only inside those models'
    # processors. The registry's torchvision wheels are CUDA builds that do not load beside the
    # CPU torch, and one in site-packages would break transformers' imports everywhere
    # (transformers prefers torchvision when it can find it)
    "torchvision": ("torchvision.transforms", "torchvision.transforms.functional"),
}


class _Absent:
    """A name from a package that is not installed: importing it works, using it raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        raise RuntimeError(self._why(f"{self._name}.{attr}"))

    def __call__(self, *args: object, **kwargs: object) -> Any:
        raise RuntimeError(self._why(self._name))

    @staticmethod
    def _why(name: str) -> str:
        package = name.split(".")[0]
        return (
            f"{name}: {package} is not installed on a CPU host; SGLang imports it for helpers "
            "the stages here never run (worker/engines/sglang/patches.py)"
        )


class _AbsentFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``_ABSENT_ON_CPU``'s modules, only while SGLang is being imported."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> Any:
        if fullname not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = ModuleType(spec.name)

        def absent(attr: str) -> _Absent:
            if attr.startswith("__"):  # the import system's own probes (__path__, ...)
                raise AttributeError(attr)
            return _Absent(f"{spec.name}.{attr}")

        module.__getattr__ = absent  # type: ignore[method-assign]
        return module

    def exec_module(self, module: ModuleType) -> None:
        pass


_finder: _AbsentFinder | None = None


def _absent_helpers_for_sglang_imports(install: bool) -> None:
    """SGLang 0.5.23 imports, at start, two packages that only notebook and image-model helpers
    use (``_ABSENT_ON_CPU`` names the lines). While its import runs, each of them that is not
    installed imports as a module whose every name raises when used, naming this patch; after
    it, they are gone from ``sys.modules`` again, so that nothing else (transformers' checks of
    what is installed) sees them. Goes when SGLang imports them lazily."""
    global _finder
    if not install:
        if _finder is not None:
            sys.meta_path.remove(_finder)
            for name in _finder.names:
                sys.modules.pop(name, None)
            _finder = None
        return
    # transformers records at import what is installed: made before the stand-ins exist
    import transformers.utils.import_utils  # noqa: F401

    names = {
        name
        for package, submodules in _ABSENT_ON_CPU.items()
        if importlib.util.find_spec(package) is None
        for name in (package, *submodules)
    }
    if names:
        _finder = _AbsentFinder(names)
        sys.meta_path.append(_finder)


@dataclass(frozen=True, slots=True)
class PlannedPool:
    """The KV pool the plan gives the engine being built: tokens, and bytes on this rank (None
    where no plan counted them: a CPU stage started outside the planner's figures)."""

    tokens: int
    bytes: int | None
    device: str  # "cpu" or "cuda:N"


_planned: PlannedPool | None = None


@contextlib.contextmanager
def planned_pool(pool: PlannedPool) -> Iterator[None]:
    """While SGLang builds an engine's scheduler (which sizes the pool): the plan's pool."""
    global _planned
    _planned = pool
    try:
        yield
    finally:
        _planned = None


def _kv_pool_from_the_plan() -> None:
    """SGLang sizes its KV pool from the GPU's free memory: ``free_now - free_at_init * (1 -
    mem_fraction_static) - mm_reservation`` (``KVCacheConfigurator._profile_available_bytes``,
    ``mem_cache/kv_cache_configurator.py:2990-3060``), where both free figures are the whole
    GPU's: another process's allocations on that GPU, before or between the two measurements,
    come out of this pool, and processes that start together (a worker's stage processes) get
    pools that depend on which loaded first, or "Loaded weights leave no GPU memory for the KV
    cache" (line 3051). SGLang-Omni replaces the profile with a per-process budget
    (``_OmniKVCacheConfigurator``); so does this: the pool is the plan's, ``tokens`` x SGLang's
    own bytes per token (``DefaultPoolConfigurator._cell_size`` and ``_fixed_overhead_bytes``,
    ``model_executor/pool_configurator.py:239-257``), after a check that the GPU holds free
    what the process still has to allocate (``worker.engines.gpu_memory.require_free``, which
    names who holds the rest when it does not). SGLang's bytes per token must be the plan's:
    a planner whose KV layout of a model differs from SGLang's would put the process past its
    footprint, and is refused naming both. ``max_total_tokens`` (the plan's tokens) still caps
    the pool (``_apply_token_constraints``, line 3090). The post-capture resize, which profiles
    the GPU again (``model_runner_components/kv_pool_runtime.py:59``), stays off
    (``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING``, off by default; the engine sets it). An engine
    built outside ``planned_pool`` keeps SGLang's profile. Goes when SGLang takes a pool
    budget in bytes."""
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator

    from worker.engines import gpu_memory

    profile = KVCacheConfigurator._profile_available_bytes

    def planned(self: Any, pre_model_load_memory: int) -> int:
        pool = _planned
        if pool is None:
            return profile(self, pre_model_load_memory)
        sizing = create_memory_pool_configurator(self)
        per_token = int(getattr(sizing, "_cell_size", 0))
        overhead = int(getattr(sizing, "_fixed_overhead_bytes", 0))
        if not per_token:
            raise RuntimeError(
                f"SGLang sizes this model's KV pool with {type(sizing).__name__}, which the "
                "plan's pool cannot be given to (worker/engines/sglang/patches.py, "
                "_kv_pool_from_the_plan)"
            )
        need = pool.tokens * per_token
        if pool.bytes is not None and need != pool.bytes:
            raise RuntimeError(
                f"SGLang keeps {per_token:,} bytes of KV per token on this rank, the plan "
                f"{pool.bytes // max(pool.tokens, 1):,}: {pool.tokens:,} tokens are "
                f"{need:,} bytes here against the plan's {pool.bytes:,}. The planner's KV "
                "layout of this model (planner/weights.py, kv_layout) differs from SGLang's"
            )
        gpu_memory.require_free(pool.device, f"its KV pool of {pool.tokens:,} tokens")
        return need + overhead

    KVCacheConfigurator._profile_available_bytes = planned


def _seeded_sampling_without_sgl_kernel() -> None:
    """A request's ``sampling_seed`` draws its tokens by hashing (seed, position, token id)
    into Gumbel noise (``layers/sampler.py``, ``multinomial_with_seed``). The hash
    (``kernels/ops/sampling/murmur_hash.py:104-126``) is a triton kernel on GPUs and
    ``sgl_kernel``'s CPU op on CPUs, neither of which exists on a CPU without AVX512. This is
    the same MurmurHash3 in torch integer ops (``murmur_hash32``), bound where the sampler
    looks it up; it gives the triton kernel's values bit for bit
    (tests/test_sglang_engine.py checks it against the reference MurmurHash3). Goes when
    SGLang ships a torch-native fallback."""
    import torch

    if torch.cuda.is_available():
        return
    from sglang.kernels.ops.sampling import murmur_hash
    from sglang.srt.layers import sampler

    murmur_hash.murmur_hash32 = murmur_hash32
    sampler.murmur_hash32 = murmur_hash32


def _per_request_seeds() -> None:
    """SGLang reads a request's ``sampling_seed`` only in deterministic-inference mode
    (``sampling/sampling_batch_info.py:157-170``), which it allows only with attention backends
    this CPU does not have (``arg_groups/overrides.py:1119``) and which costs speed on GPUs. A
    seed is an API field here (the same seed gives the same reply), so every batch carries its
    requests' seeds; the engine gives every request one (a sampled request without a seed gets
    a random one). Always a tensor: ``merge_batch`` (lines 610-620) concatenates seeds only when
    both sides have them. Goes when SGLang honours per-request seeds outside deterministic
    mode."""
    import torch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    build = SamplingBatchInfo.from_schedule_batch.__func__

    def from_schedule_batch(cls, batch, vocab_size):
        info = build(cls, batch, vocab_size)
        if info.sampling_seed is None:
            seeds = [r.sampling_params.sampling_seed or 0 for r in batch.reqs]
            info.sampling_seed = torch.tensor(seeds, dtype=torch.int64, device=batch.device)
        return info

    SamplingBatchInfo.from_schedule_batch = classmethod(from_schedule_batch)


def _repetition_penalty_over_the_prompt() -> None:
    """SGLang's repetition penalty counts generated tokens only
    (``sampling/penaltylib/repetition_penalty.py:32-57``: ``_prepare`` starts every row at 1,
    ``_cumulate_output_tokens`` marks each generated token). transformers' processor, which the
    official Qwen packages run, and vLLM count the prompt's tokens too, as the project's torch
    engine does (``worker/contract/sampling.py``), so the same request would repeat differently on
    the two engines. Each row starts with its prompt's tokens marked (the ids before SGLang pads
    a clip or an image: the placeholder tokens, as transformers sees them). Goes when SGLang
    counts the prompt."""
    import torch
    from sglang.srt.sampling.penaltylib.repetition_penalty import BatchedRepetitionPenalizer

    prepare = BatchedRepetitionPenalizer._prepare

    def _prepare(self) -> None:
        prepare(self)
        vocab = self.orchestrator.vocab_size
        rows = self.cumulated_repetition_penalties
        for row, req in enumerate(self.orchestrator.reqs()):
            penalty = req.sampling_params.repetition_penalty
            if penalty != 1.0:
                ids = [i for i in req.origin_input_ids_unpadded if 0 <= i < vocab]
                rows[row, torch.tensor(ids, dtype=torch.int64, device=rows.device)] = penalty

    BatchedRepetitionPenalizer._prepare = _prepare


def _seeded_draws_in_vocabulary_order() -> None:
    """A seeded draw hashes (seed, position, column) into Gumbel noise. Without top-k, top-p or
    min-p the columns are token ids (``sampling_from_probs_torch``, ``layers/sampler.py:978``);
    with them, SGLang's torch path hashes the columns of the probabilities *sorted*
    (``top_k_top_p_min_p_sampling_from_probs_torch``, lines 785-858), and whether a batch takes
    that path depends on every request in it (one request with a top-k sends all there). So
    the same seeded request drew other tokens when a batchmate asked for top-k, or when a
    greedy request joined it (greedy rows are top-k 1); and min-p with a seed is refused by an
    assertion (line 831). Here a seeded batch is filtered in sorted order as SGLang does, the
    kept probabilities are put back in vocabulary order, and the draw hashes token ids: a
    request's tokens depend on its seed, its settings and its logits only. Goes when SGLang's
    seeded path is batch-independent."""
    import torch
    from sglang.srt.layers import sampler

    batch_dependent = sampler.top_k_top_p_min_p_sampling_from_probs_torch

    def filtered_then_drawn(
        probs, top_ks, top_ps, min_ps, need_min_p_sampling, sampling_seed, positions, **kw
    ):
        if sampling_seed is None or kw.get("return_filtered_probs"):
            return batch_dependent(probs, top_ks, top_ps, min_ps, need_min_p_sampling,
                                   sampling_seed, positions, **kw)  # fmt: skip
        kept, order = probs.sort(dim=-1, descending=True)
        before = torch.cumsum(kept, dim=-1) - kept
        ranks = torch.arange(kept.shape[-1], device=probs.device).view(1, -1)
        kept[(ranks >= top_ks.view(-1, 1)) | (before > top_ps.view(-1, 1))] = 0.0
        if need_min_p_sampling:
            kept[kept < (kept[:, :1] * min_ps.view(-1, 1))] = 0.0
        in_vocab_order = torch.zeros_like(probs).scatter_(1, order, kept)
        drawn = sampler.multinomial_with_seed(
            in_vocab_order.to(torch.float64).log_(), sampling_seed, positions
        )
        return drawn.view(-1).to(torch.int32)

    sampler.top_k_top_p_min_p_sampling_from_probs_torch = filtered_then_drawn


def _cpu_attention() -> None:
    """SGLang's ``torch_native`` attention, the one a CPU without ``sgl_kernel`` has, loops
    over a batch's requests in Python and recomputes cached prefixes
    (``layers/attention/torch_native_backend.py:61-260``); ``cpu_attention.PagedAttention``
    runs one attention call per layer over the paged pool instead (its docstring has the
    figures). Registered under SGLang's own name (``attention_registry.py:217``), on CPUs only.
    Goes when SGLang ships a batched torch-native paged attention."""
    import torch

    if torch.cuda.is_available():
        return
    from sglang.srt.layers.attention import attention_registry

    from worker.engines.sglang.cpu_attention import PagedAttention

    attention_registry.ATTENTION_BACKENDS["torch_native"] = PagedAttention


def _cpu_decoder_stack() -> None:
    """The three model bodies the families run (``Qwen2Model.forward``,
    ``models/qwen2.py:434-498``; ``Qwen2MoeModel.forward``, ``models/qwen2_moe.py:1159-1215``;
    ``Qwen3MoeLLMModel.forward``, ``models/qwen3_vl_moe.py:85-168``) run their layers as one
    plain loop over the layers' own weights on a CPU (``cpu_stack``: SGLang's per-layer
    machinery is what CUDA graphs replay away on a GPU host, and most of a CPU decode step
    here), for a model all of whose parts the stack knows; any other keeps SGLang's forward.
    Goes when SGLang's CPU graph runner (``model_executor/cpu_graph_runner.py``) runs without
    ``sgl_kernel``'s AMX attention."""
    import torch

    if torch.cuda.is_available():
        return
    from sglang.srt.models.qwen2 import Qwen2Model
    from sglang.srt.models.qwen2_moe import Qwen2MoeModel
    from sglang.srt.models.qwen3 import Qwen3Model
    from sglang.srt.models.qwen3_vl_moe import Qwen3MoeLLMModel

    from worker.engines.sglang import cpu_stack

    for cls, body in (
        (Qwen2Model, cpu_stack.plain_body),
        (Qwen3Model, cpu_stack.plain_body),  # (it overrides Qwen2Model's, alike)
        (Qwen2MoeModel, cpu_stack.plain_body),
        (Qwen3MoeLLMModel, cpu_stack.deepstack_body),
    ):
        cls.forward = cpu_stack.replacing(cls.forward, body)


_MASK = 0xFFFFFFFF


def _mul32(a, b: int):  # (a * b) mod 2^32 in int64 without overflow: split b into 16-bit halves
    return (a * (b & 0xFFFF) + (((a * (b >> 16)) & 0xFFFF) << 16)) & _MASK


def _rotl32(x, r: int):
    return ((x << r) | (x >> (32 - r))) & _MASK


def _mix(h, k):
    k = _mul32(k, 0xCC9E2D51)
    k = _rotl32(k, 15)
    k = _mul32(k, 0x1B873593)
    h = h ^ k
    h = _rotl32(h, 13)
    return (h * 5 + 0xE6546B64) & _MASK


def murmur_hash32(seed, positions, col_indices):
    """MurmurHash3 (x86, 32 bit, seed 0) of the 16 bytes (seed low, seed high, position,
    column) for every row's seed and position and every column: ``(n, m)`` uint32."""
    import torch

    seed = seed.to(torch.int64)
    h = torch.zeros_like(seed)
    h = _mix(h, seed & _MASK)
    h = _mix(h, (seed >> 32) & _MASK)
    h = _mix(h, positions.to(torch.int64) & _MASK)[:, None]
    h = _mix(h, col_indices.to(torch.int64)[None, :] & _MASK)
    h = h ^ 16
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    h = h ^ (h >> 16)
    return h.to(torch.uint32)
