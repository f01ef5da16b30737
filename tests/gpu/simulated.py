"""A CUDA GPU's memory simulated on the CPU, and the worker's GPU processes loading onto it.

What SGLang and the worker read of a GPU is modelled as the driver reports it: the device's
total, each process's CUDA context (held by the driver, outside torch's caching allocator), each
process's allocator (its reserved bytes, failing past its cap as torch's
``set_per_process_memory_fraction`` makes it fail), another tenant's memory, and one global free
figure (``mem_get_info``) that every process sees. A process's life is the order in which a
stage process of the worker takes its memory on a GPU host (``worker/runtime/host.py``, then
SGLang's ``ModelRunner``): its context and the plan's cap, SGLang's free-memory baseline
(``measure_pre_model_load_memory``), its weights, each engine's KV pool as SGLang's own
``KVCacheConfigurator`` sizes it (with the vendor layer's patch, under the worker's own server
arguments), its workspaces and CUDA graphs, then its activations. Lives are generators: a
schedule interleaves them step by step, as processes that start together load.

Only the allocations are simulated: the pool sizes come from SGLang's code, the caps and the free
checks from the worker's (``worker.engines.gpu_memory``, reached through its ``memory``).
"""

from __future__ import annotations

import contextlib
import itertools
import random
import tempfile
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.plan import GpuPlan, NodePlan, ProcessPlan, StagePlacement
from planner.spec import ModelSpec
from worker.contract.stage_context import StageContext
from worker.engines import gpu_memory
from worker.engines.gpu_memory import GpuBudget, Holder

GIB = 1 << 30


class OutOfMemory(RuntimeError):
    """An allocation the GPU or the process's allocator cap refused (torch's OutOfMemoryError)."""


@dataclass(eq=False)
class SimProcess:
    name: str
    pid: int
    context: int = 0  # the driver's, outside the allocator
    reserved: int = 0  # the caching allocator's
    cap: int | None = None  # the allocator's limit (bytes), once the process sets one
    peak: int = 0  # the most it held (context + reserved)

    @property
    def held(self) -> int:
        return self.context + self.reserved


class SimulatedGpu:
    def __init__(self, total: int, foreign: tuple[Holder, ...] = ()) -> None:
        self.total = total
        self.processes: list[SimProcess] = []
        self.foreign = list(foreign)  # another tenant's processes

    def free(self) -> int:
        used = sum(p.held for p in self.processes) + sum(h.used_bytes for h in self.foreign)
        return self.total - used

    def start(self, name: str, context: int) -> SimProcess:
        """A process initialises CUDA: the driver takes its context."""
        if context > self.free():
            raise OutOfMemory(f"{name}: no room for a CUDA context ({self.free()} free)")
        proc = SimProcess(name, 10_000 + len(self.processes), context=context)
        proc.peak = proc.held
        self.processes.append(proc)
        return proc

    def alloc(self, proc: SimProcess, n: int, what: str) -> None:
        if proc.cap is not None and proc.reserved + n > proc.cap:
            raise OutOfMemory(
                f"{proc.name}: {what} ({n / GIB:.2f} GiB) past the allocator's cap: it holds "
                f"{proc.reserved / GIB:.2f} of {proc.cap / GIB:.2f} GiB"
            )
        if n > self.free():
            raise OutOfMemory(
                f"{proc.name}: {what} ({n / GIB:.2f} GiB) past the GPU: {self.free() / GIB:.2f} "
                "GiB free"
            )
        proc.reserved += n
        proc.peak = max(proc.peak, proc.held)

    def holders(self) -> list[Holder]:
        found = [Holder(p.pid, p.name, p.held) for p in self.processes] + self.foreign
        return sorted(found, key=lambda h: -h.used_bytes)


@dataclass
class ProcessView:
    """``gpu_memory.DeviceMemory`` as one process sees the simulated GPU."""

    gpu: SimulatedGpu
    proc: SimProcess

    def free_and_total(self, device: str) -> tuple[int, int]:
        return self.gpu.free(), self.gpu.total

    def reserved(self, device: str) -> int:
        return self.proc.reserved

    def cap(self, fraction: float, device: str) -> None:
        self.proc.cap = int(fraction * self.gpu.total)  # (torch: a fraction of the total)

    def holders(self, device: str) -> list[Holder]:
        return [h for h in self.gpu.holders() if h.pid != self.proc.pid]


class SGLangPool:
    """One engine's KV pool as SGLang sizes it in the stage process: the worker's server
    arguments (``EngineSettings`` as the host builds it from the plan, ``_server_args``),
    SGLang's runtime context and model config for them, and its own ``KVCacheConfigurator``,
    whose ``_resolve_memory_pool_config`` the engine's scheduler runs at start (under the vendor
    layer's ``planned_pool``, as ``SGLangEngine`` runs it)."""

    def __init__(self, settings: Any) -> None:
        import torch
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.managers.scheduler import SpawnRanks
        from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
        from sglang.srt.model_executor.model_runner_components.layer_setup import (
            resolve_layer_indices,
        )
        from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (
            SpecAuxHiddenStateConfig,
        )
        from sglang.srt.runtime_context import create_context, get_parallel, use_context
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        from worker.engines.sglang.engine import _server_args

        self.settings = settings
        self.use_context = use_context
        self.server_args = _server_args(settings)
        ranks = SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0)
        self.context = create_context(self.server_args, role="scheduler", ranks=ranks)
        with use_context(self.context):
            # (the world group SGLang's profile reads; one rank, no group to reduce over)
            get_parallel().override_permanently(world_group=types.SimpleNamespace(cpu_group=None))
            model_config = ModelConfig.from_server_args(self.server_args)
            kv_dtypes = {"bfloat16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}
            kv_dtypes["auto"] = getattr(torch, self.server_args.dtype)
            kv_dtype = kv_dtypes[self.server_args.kv_cache_dtype]
            self.configurator = KVCacheConfigurator(
                device="cuda", gpu_id=0, attn_dp_size=1, pp_size=1, pp_group=None, model=None,
                model_config=model_config, server_args=self.server_args,
                kv_cache_dtype=kv_dtype, model_dtype=getattr(torch, self.server_args.dtype),
                page_size=1, sliding_window_size=None, spec_algorithm=SpeculativeAlgorithm.NONE,
                is_draft_worker=False, post_capture_kv_active=False,
                spec_aux_config=SpecAuxHiddenStateConfig(), is_hybrid_swa=False,
                is_hybrid_swa_compress=False, use_mla_backend=False,
                layer_info=resolve_layer_indices(
                    model=types.SimpleNamespace(), model_config=model_config,
                    is_draft_worker=False,
                ),
                forward_stream=None, req_to_token_pool=None, token_to_kv_pool_allocator=None,
                memory_pool_config=None,
            )  # fmt: skip

    def size(self, gpu: SimulatedGpu, pre_model_load_gib: float) -> tuple[int, int]:
        """SGLang's pool: (tokens, bytes), its free-memory figures ``gpu``'s."""
        from sglang.srt.mem_cache import kv_cache_configurator
        from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator

        from worker.engines.sglang import patches

        profile = kv_cache_configurator.get_available_gpu_memory
        kv_cache_configurator.get_available_gpu_memory = lambda *a, **k: gpu.free() / GIB
        try:
            with self.use_context(self.context), patches.planned_pool(self.settings.planned_pool()):
                config = self.configurator._resolve_memory_pool_config(pre_model_load_gib)
                per_token = create_memory_pool_configurator(self.configurator)._cell_size
        finally:
            kv_cache_configurator.get_available_gpu_memory = profile
        tokens = int(config.max_total_num_tokens)
        return tokens, tokens * int(per_token)


@dataclass
class Loaded:
    """What one process did on the GPU."""

    plan: ProcessPlan
    budget: GpuBudget
    pools: dict[str, tuple[int, int]] = field(default_factory=dict)  # stage -> (tokens, bytes)
    proc: SimProcess | None = None


@dataclass
class GpuLayout:
    """The processes a plan puts on one GPU, with what each of their engines will start with."""

    gpu: GpuPlan
    processes: list[ProcessPlan]
    settings: dict[tuple[str, str], Any]  # (process, stage) -> EngineSettings
    on_gpu: frozenset[str]  # the stages that run on the GPU (a CPU stage holds host memory)
    tmp: Any = None  # the talkers' SGLang model directories

    @classmethod
    def of(cls, spec: ModelSpec, spec_path: Path, node: NodePlan, index: int) -> GpuLayout:
        """GPU ``index`` of a node's plan: its processes, and each engine's settings as the
        stage process builds them (``EngineSettings.of_stage`` of the host's context; a
        talker's from its family's SGLang model directory, as ``talker_engine`` does)."""
        from worker.engines.sglang.engine import EngineSettings

        gpu = node.gpus[index]
        processes = [p for p in node.processes if index in p.gpus]
        tmp = tempfile.TemporaryDirectory(prefix="gpu-sim-")
        settings: dict[tuple[str, str], Any] = {}
        checkpoint = (spec_path.parent / spec.model_dir).resolve()
        dirs: dict[str, Path] = {}
        for p in processes:
            budget = GpuBudget.of(p, gpu)
            for placed in p.stages:
                if placed.engine is None:
                    continue
                stage = spec.stages[placed.stage]
                ctx = StageContext(placed.stage, spec, stage, checkpoint, "cuda:0",
                                   placed.max_running_requests, kv_tokens=placed.kv_tokens,
                                   engine=placed.engine)  # fmt: skip
                with acting_budget(budget):
                    s = EngineSettings.of_stage(ctx)
                if stage.engine.prompt == "embeddings":
                    if placed.stage not in dirs:
                        out = Path(tmp.name) / placed.stage
                        dirs[placed.stage] = talker_model_dir(checkpoint)(checkpoint, out)
                    s = _replace(s, model_path=dirs[placed.stage])
                settings[(p.name, placed.stage)] = s
        on_gpu = frozenset(n for n, st in spec.stages.items() if st.device.value == "gpu")
        return cls(gpu, processes, settings, on_gpu, tmp)


def talker_model_dir(checkpoint: Path) -> Callable[[Path, Path], Path]:
    """The family's writer of its talker's SGLang model directory (``talker_engine``'s)."""
    from worker.models.registry import family_of

    family = family_of(checkpoint).name
    if family == "Qwen3-Omni":
        from worker.models.qwen3_omni.talker_sglang import register, sglang_model_dir
    else:
        from worker.models.qwen3_tts.talker_sglang import register, sglang_model_dir
    register()  # (the class SGLang's model config names)
    return sglang_model_dir


def _replace(settings: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(settings, **changes)


@contextlib.contextmanager
def acting_budget(budget: GpuBudget | None) -> Iterator[None]:
    saved = gpu_memory._budget
    gpu_memory._budget = budget
    try:
        yield
    finally:
        gpu_memory._budget = saved


@contextlib.contextmanager
def acting(gpu: SimulatedGpu, proc: SimProcess, budget: GpuBudget | None) -> Iterator[None]:
    """While one process runs a step: ``gpu_memory`` sees its view of the GPU and its budget."""
    saved = gpu_memory.memory
    gpu_memory.memory = ProcessView(gpu, proc)
    try:
        with acting_budget(budget):
            yield
    finally:
        gpu_memory.memory = saved


def life(
    gpu: SimulatedGpu, layout: GpuLayout, plan: ProcessPlan, pools: dict, out: Loaded
) -> Iterator[str]:
    """One stage process on the GPU, step by step (each ``yield``, another may run)."""
    budget = GpuBudget.of(plan, layout.gpu)
    out.budget = budget
    proc = gpu.start(plan.name, plan.cuda_context_bytes)  # CUDA initialised
    out.proc = proc
    with acting(gpu, proc, None):
        gpu_memory.apply(budget, "cuda:0")  # the host's cap (worker/runtime/host.py)
    yield "context"
    pre_model_load_gib = gpu.free() / GIB  # SGLang's baseline (measure_pre_model_load_memory)
    yield "baseline"
    on_gpu = [placed for placed in plan.stages if placed.stage in layout.on_gpu]
    for placed in on_gpu:
        gpu.alloc(proc, placed.memory.weights, f"{placed.stage} weights")
    yield "weights"
    for placed in on_gpu:
        if placed.engine is None:
            continue
        with acting(gpu, proc, budget):
            tokens, size = pools[(plan.name, placed.stage)].size(gpu, pre_model_load_gib)
        gpu.alloc(proc, size, f"{placed.stage}'s KV pool of {tokens:,} tokens")
        out.pools[placed.stage] = (tokens, size)
    yield "pools"
    # workspaces, and the CUDA graphs of a token engine: the runtime less the context
    runtime = plan.memory_per_gpu.runtime - plan.cuda_context_bytes
    gpu.alloc(proc, runtime, "workspaces and CUDA graphs")
    yield "graphs"
    for placed in on_gpu:
        gpu.alloc(proc, placed.memory.activations, f"{placed.stage} activations")
    yield "serving"


def schedules(n: int, seed: int = 0, sampled: int = 24) -> Iterator[tuple[str, list[int]]]:
    """Orders of ``n`` processes' steps: for every start order (all of them up to four
    processes, ``sampled`` beyond), one after another and step by step in turn; then seeded
    random interleavings. A schedule is the process to step next, until all are done."""
    rng = random.Random(seed)
    orders = list(itertools.permutations(range(n))) if n <= 4 else [
        rng.sample(range(n), n) for _ in range(sampled)
    ]  # fmt: skip
    steps = 6  # (a life's yields)
    for order in orders:
        yield f"one after another {list(order)}", [i for i in order for _ in range(steps)]
        yield f"step by step {list(order)}", [i for _ in range(steps) for i in order]
    for k in range(sampled):
        seq = [i for i in range(n) for _ in range(steps)]
        rng.shuffle(seq)
        yield f"random interleaving {k}", seq


def load(
    layout: GpuLayout, pools: dict, order: list[int], gpu: SimulatedGpu | None = None
) -> tuple[SimulatedGpu, list[Loaded]]:
    """Every process of ``layout`` loading onto ``gpu`` (a fresh one of the plan's size) in
    ``order``."""
    gpu = gpu or SimulatedGpu(layout.gpu.capacity_bytes)
    loaded = [Loaded(p, GpuBudget.of(p, layout.gpu)) for p in layout.processes]
    lives = [
        life(gpu, layout, p, pools, out) for p, out in zip(layout.processes, loaded, strict=True)
    ]
    for i in order:
        next(lives[i], None)
    return gpu, loaded


def planned_pool(placed: StagePlacement) -> tuple[int, int]:
    assert placed.engine is not None
    return placed.kv_tokens, placed.engine.kv_bytes


def engine_pools(layout: GpuLayout) -> dict[tuple[str, str], SGLangPool]:
    """Each engine's SGLang pool sizing, built once for engines started alike."""
    import dataclasses

    built: dict[Any, SGLangPool] = {}
    pools = {}
    for key, settings in layout.settings.items():
        alike = dataclasses.replace(settings, budget=None)
        if alike not in built:
            built[alike] = SGLangPool(settings)
        pools[key] = built[alike]
    return pools
