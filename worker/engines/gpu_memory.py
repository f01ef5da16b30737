"""A GPU process's memory as the plan gives it: the process's caching allocator capped at its
planned footprint, and, before an engine sizes its KV pool, a check that the GPU holds free what
the process still has to allocate.

The plan keeps every process's footprint on a GPU (its runtime, CUDA graphs, weights, KV pool
and activations), plus the reserve, within the GPU. When each process holds at most its own
footprint, a process finds what it still needs free whichever of them loaded first, and each
KV pool is the plan's (``worker/engines/sglang/patches.py``, ``_kv_pool_from_the_plan``): the
processes on one GPU may start in any order. A check that fails names who holds the rest.

The cap is torch's ``set_per_process_memory_fraction``: it bounds what the caching allocator
reserves, which is everything but the CUDA context (the driver's, outside the allocator), so
the cap is the footprint less the catalog's context estimate. CUDA graph pools, cuBLAS
workspaces and SGLang's buffers are allocator memory and count against it, as the plan counts
them in the process's runtime.

The device is reached through ``DeviceMemory``: CUDA here, a simulated GPU in ``tests/gpu/``,
which drives this module and SGLang's own pool sizing under processes loading in every order.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from planner.plan import GpuPlan, ProcessPlan


@dataclass(frozen=True, slots=True)
class GpuBudget:
    """What the plan gives one process on each of its GPUs (``planner.plan.ProcessPlan``)."""

    process: str  # the plan's name, "<replica>/<group>"
    gpu_name: str  # the catalog's, e.g. "H100-80GB"
    capacity_bytes: int  # the GPU's memory as the plan knows it
    footprint_bytes: int  # the process's planned bytes on the GPU, runtime included
    context_bytes: int  # of which the CUDA context, outside torch's caching allocator

    @property
    def allocator_bytes(self) -> int:
        """What the process's caching allocator may reserve: the footprint but the context."""
        return max(self.footprint_bytes - self.context_bytes, 0)

    @classmethod
    def of(cls, process: ProcessPlan, gpu: GpuPlan) -> GpuBudget:
        """A GPU process's budget on ``gpu``, one of its GPUs (a process's GPUs are of one
        type, and its ranks' footprints alike)."""
        return cls(
            process=process.name,
            gpu_name=gpu.name,
            capacity_bytes=gpu.capacity_bytes,
            footprint_bytes=process.memory_per_gpu.total,
            context_bytes=process.cuda_context_bytes,
        )


@dataclass(frozen=True, slots=True)
class Holder:
    """A process holding memory on a GPU, as the driver reports it."""

    pid: int
    name: str
    used_bytes: int


class DeviceMemory(Protocol):
    def free_and_total(self, device: str) -> tuple[int, int]:
        """The device's free and total bytes, after this process's cached blocks are freed."""
        ...

    def reserved(self, device: str) -> int:
        """What this process's caching allocator holds on the device."""
        ...

    def cap(self, fraction: float, device: str) -> None:
        """Caps this process's caching allocator at ``fraction`` of the device."""
        ...

    def holders(self, device: str) -> list[Holder]:
        """The other processes holding memory on the device (empty where the driver cannot
        say)."""
        ...


class CudaMemory:
    """The device memory of CUDA GPUs: torch's allocator, the driver's figures, NVML."""

    def free_and_total(self, device: str) -> tuple[int, int]:
        import torch

        gc.collect()  # (tensors no longer referenced, before their blocks are given back)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)

    def reserved(self, device: str) -> int:
        import torch

        return int(torch.cuda.memory_reserved(device))

    def cap(self, fraction: float, device: str) -> None:
        import torch

        torch.cuda.set_per_process_memory_fraction(fraction, device)

    def holders(self, device: str) -> list[Holder]:
        try:
            import pynvml
            import torch

            uuid = str(torch.cuda.get_device_properties(device).uuid)
            pynvml.nvmlInit()
        except Exception:  # no NVML, no driver: nothing to name
            return []
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(nvml_uuid(uuid))
            found = []
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.pid == os.getpid():
                    continue
                comm = Path(f"/proc/{p.pid}/comm")
                name = comm.read_text().strip() if comm.exists() else "not in this namespace"
                found.append(Holder(int(p.pid), name, int(p.usedGpuMemory or 0)))
            return sorted(found, key=lambda h: -h.used_bytes)
        except Exception:
            return []
        finally:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()


def nvml_uuid(torch_uuid: str) -> bytes:
    """NVML's name of a device torch calls ``torch_uuid`` (``GPU-`` and the UUID; torch's
    ``get_device_properties().uuid`` leaves the prefix out)."""
    text = str(torch_uuid)
    return (text if text.startswith("GPU-") else f"GPU-{text}").encode()


class GpuBudgetError(RuntimeError):
    """The GPU does not hold free what the plan gives a process."""


# This process's device memory and budget (set by ``apply``, read where an engine sizes its
# pool); tests replace ``memory`` with a simulated GPU
memory: DeviceMemory = CudaMemory()
_budget: GpuBudget | None = None


def apply(budget: GpuBudget, device: str) -> None:
    """This process runs on ``device`` with ``budget``: its allocator is capped at the
    footprint less the CUDA context. torch takes the cap as a fraction of the device's total as
    the CUDA runtime reports it (``cudaMemGetInfo``), which is less than NVML's (what the
    catalog and the plan count) by what the driver keeps: the fraction is taken of that total,
    so the cap is the plan's bytes (rounded up at a millionth of the device: torch truncates
    the product to whole bytes)."""
    global _budget
    _, total = memory.free_and_total(device)
    memory.cap(min(1.0, math.ceil(budget.allocator_bytes / total * 1e6) / 1e6), device)
    _budget = budget


def current() -> GpuBudget | None:
    return _budget


def require_free(device: str, what: str) -> None:
    """Before ``what`` (a KV pool) is allocated: the GPU must hold free the rest of the
    process's footprint (what it has not yet allocated: the pool, CUDA graphs, activations).
    A GpuBudgetError names the plan's bytes, the free bytes and the processes holding the
    rest. No budget (a CPU, an engine started outside a plan): nothing to check."""
    budget = _budget
    if budget is None or not device.startswith("cuda"):
        return
    held = memory.reserved(device) + budget.context_bytes
    need = max(budget.footprint_bytes - held, 0)
    free, total = memory.free_and_total(device)
    if free >= need:
        return
    holders = memory.holders(device)
    named = "; ".join(f"pid {h.pid} ({h.name}) {_gib(h.used_bytes)}" for h in holders[:6])
    raise GpuBudgetError(
        f"process {budget.process}: the plan gives it {_gib(budget.footprint_bytes)} of "
        f"{device} ({budget.gpu_name}, {_gib(total)}); it holds {_gib(held)} and needs "
        f"{_gib(need)} more for {what} and the rest of its plan, but {_gib(free)} is free: "
        f"the other {_gib(total - free - held)} are held by "
        + (named or "processes the driver does not list (NVML unavailable)")
        + ". Free the GPU (another tenant?), or plan this node with less: "
        "omni-plan SPEC --gpus ... shows each process's footprint"
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
