"""The launch plan: what ``omni-plan`` prints and exactly what ``omni-worker`` launches.

JSON-serialisable and versioned. Bytes are integers; nothing here is computed lazily, so a
plan read back from JSON is the same plan.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

PLAN_VERSION = 2  # 2: each engine's SGLang arguments; processes' allocator caps


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryBudget(Frozen):
    weights: int = 0
    kv_cache: int = 0
    activations: int = 0
    runtime: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations + self.runtime


class EnginePlan(Frozen):
    """An autoregressive stage's SGLang engine, as the worker starts it (planner.engine_plan)."""

    attention_backend: str
    kv_bytes: int  # its KV pool per rank: kv_tokens x the bytes a token's KV takes on a rank
    sglang: dict[str, Any]  # SGLang's server arguments (run-time: the model path, ranks' port)


class StagePlacement(Frozen):
    """One stage inside one process, on one device (per TP rank for GPU stages)."""

    stage: str
    dtype: str = ""  # the dtype its weights are loaded and run in (the spec's, resolved)
    memory: MemoryBudget = Field(default_factory=MemoryBudget)
    kv_tokens: int = 0  # KV capacity in tokens (autoregressive stages)
    max_running_requests: int = 0
    params: int = 0  # weight elements of the stage's component (whole model, not per rank)
    buffers: int = 0  # stored (persistent) buffer elements, counted with the weights
    kv_bytes_per_token: int = 0  # whole model, all TP ranks together
    memory_share: float | None = None  # the declared share of a colocated layout
    engine: EnginePlan | None = None  # an autoregressive stage's SGLang engine


class ProcessPlan(Frozen):
    name: str  # "<replica>/<process group>", unique on the node
    group: str  # the spec's process group
    replica: int
    stages: list[StagePlacement]
    device: str  # "gpu" | "cpu"
    gpus: list[int] = Field(default_factory=list)  # node-local indices, one per TP rank
    tp_size: int = 1
    env: dict[str, str] = Field(default_factory=dict)  # includes CUDA_VISIBLE_DEVICES
    # the process's footprint on each of its GPUs: runtime (CUDA context, workspaces, CUDA
    # graphs) and its stages; what the worker checks is free before it sizes a KV pool
    memory_per_gpu: MemoryBudget = Field(default_factory=MemoryBudget)
    # of the footprint, what the CUDA driver holds outside torch's caching allocator (the
    # catalog's estimate of a context), and the share of each GPU the allocator may hold: the
    # footprint less the context; None on the CPU
    cuda_context_bytes: int = 0
    allocator_fraction: float | None = None


class GpuPlan(Frozen):
    index: int
    name: str  # catalog name, e.g. "H100-80GB"
    capacity_bytes: int
    reserved_bytes: int  # headroom kept free by policy
    by_stage: dict[str, MemoryBudget] = Field(default_factory=dict)  # "<replica>/<stage>"
    planned: MemoryBudget = Field(default_factory=MemoryBudget)

    @property
    def headroom_bytes(self) -> int:
        return self.capacity_bytes - self.planned.total


class ReplicaPlan(Frozen):
    index: int
    gpus: list[int]
    processes: list[str]  # ProcessPlan names


class NodePlan(Frozen):
    node: str
    gpus: list[GpuPlan]
    replicas: list[ReplicaPlan]
    processes: list[ProcessPlan]


class PlanError(Frozen):
    """Why a layout does not fit, precisely enough to act on."""

    node: str
    gpu: int | None
    overflow_bytes: int
    message: str
    fixes: list[str] = Field(default_factory=list)


class FleetTotals(Frozen):
    """Sums over every node of an inventory."""

    nodes: int = 0
    gpus: int = 0
    replicas: int = 0
    capacity_bytes: int = 0
    planned: MemoryBudget = Field(default_factory=MemoryBudget)
    replicas_by_gpu_type: dict[str, int] = Field(default_factory=dict)


class LaunchPlan(Frozen):
    version: int = PLAN_VERSION
    spec: str  # spec name
    spec_digest: str  # sha256 of the resolved spec's JSON
    fits: bool
    errors: list[PlanError] = Field(default_factory=list)
    warnings: list[PlanError] = Field(default_factory=list)  # e.g. a fleet node that holds none
    nodes: list[NodePlan] = Field(default_factory=list)
    fleet: FleetTotals = Field(default_factory=FleetTotals)

    @property
    def replicas(self) -> int:
        return sum(len(n.replicas) for n in self.nodes)

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]
