"""A model family that holds memory instead of running a model: bench/gpu_check.py's stand-in
for every stage of a shipped layout, so that the memory handshake is checked with real stage
processes (the worker's own launcher and host: its allocator cap, its check of free memory
before a KV pool) and real CUDA allocations at real size, on a GPU machine without SGLang.

Each stage takes on its process's device what the plan gives it, in the order a stage process
takes it: random weights of the plan's bytes, then for an autoregressive stage the check that
the GPU holds free the rest of the process's footprint (``worker.engines.gpu_memory``, what the
vendor layer calls before SGLang allocates a pool) and the KV pool of the plan's bytes, then the
process's workspaces and CUDA graphs (its runtime less the CUDA context, once a process), then
its activations. What it held is written to ``<checkpoint>/held/<pid>-<stage>.json``: the
allocator's peak, the driver's count of the process's memory, the free memory it saw.

The checkpoint is a folder with ``config.json`` (``model_type: omni-fleet-gpu-probe``) and
``probe.json`` (each stage's planned weights and activations, each process group's runtime and
context; bytes, times ``scale`` for a dry run on the CPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from worker.contract.stage_context import StageContext
from worker.models.family import Family
from worker.stages.base import Output, RequestMeta, StageExecutor

MODEL_TYPE = "omni-fleet-gpu-probe"
_runtime_taken: set[str] = set()  # (the process's runtime is taken once, by its first stage)


class HoldingExecutor(StageExecutor):
    """Holds the plan's memory of one stage; serves nothing."""

    def load(self) -> None:
        import torch

        from worker.engines import gpu_memory

        ctx = self.ctx
        probe = json.loads((ctx.checkpoint / "probe.json").read_text())
        plan = probe["stages"][ctx.name]
        group = probe["groups"][ctx.stage.process]
        scale = float(probe.get("scale", 1.0))
        device = ctx.device
        self.held: list[Any] = []  # the tensors, kept until the process stops
        self.log: list[tuple[str, int]] = []  # (what, bytes) in the order taken
        if device == "cpu" and not probe.get("dry_run"):
            return  # (a CPU stage of a GPU process: host memory, not this check's)

        def take(n: float, what: str) -> None:
            size = int(n * scale)
            if size > 0:
                t = torch.empty(size, dtype=torch.uint8, device=device)
                t.random_(0, 255)  # (touched, as random weights are)
                self.held.append(t)
            self.log.append((what, size))

        take(plan["weights"], "weights")
        if ctx.engine is not None:
            gpu_memory.require_free(device, f"its KV pool of {ctx.kv_tokens:,} tokens")
            take(ctx.engine.kv_bytes, "KV pool")
        if ctx.stage.process not in _runtime_taken:
            _runtime_taken.add(ctx.stage.process)
            take(group["runtime"] - group["context"], "workspaces and CUDA graphs")
        take(plan["activations"], "activations")
        self._report(probe)

    def _report(self, probe: dict) -> None:
        import torch

        from worker.engines import gpu_memory

        ctx = self.ctx
        cuda = ctx.device.startswith("cuda")
        budget = gpu_memory.current()
        free, total = gpu_memory.memory.free_and_total(ctx.device) if cuda else (0, 0)
        me = _own_use(ctx.device) if cuda else None
        out = {
            "pid": os.getpid(),
            "group": ctx.stage.process,
            "stage": ctx.name,
            "took": self.log,
            "kv_tokens": ctx.kv_tokens if ctx.engine is not None else 0,
            "reserved_peak": int(torch.cuda.max_memory_reserved(ctx.device)) if cuda else 0,
            "driver_used": me,  # (NVML: the CUDA context included)
            "free": free,
            "total": total,
            "budget": None if budget is None else dataclasses.asdict(budget),
        }
        held = ctx.checkpoint / "held"
        held.mkdir(exist_ok=True)
        (held / f"{os.getpid()}-{ctx.name}.json").write_text(json.dumps(out))

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        raise RuntimeError("the GPU probe serves no requests")

    def abort(self, rid: str) -> None:
        pass

    def next_deadline(self) -> float | None:
        return None

    def step(self) -> list[Output]:
        return []

    def queue_depth(self) -> int:
        return 0


def _own_use(device: str) -> int | None:
    """What the driver counts this process holds on the device (NVML), or None."""
    import torch

    from worker.engines.gpu_memory import nvml_uuid

    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(nvml_uuid(uuid))
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == os.getpid():
                return int(p.usedGpuMemory or 0)
        return None
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()  # (unbound when the import failed: suppressed)


def make_executor(ctx: StageContext) -> StageExecutor:
    return HoldingExecutor(ctx)


FAMILY = Family("gpu-probe", MODEL_TYPE, make_executor)


def write_checkpoint(out: Path, probe: dict[str, Any]) -> Path:
    """The probe's checkpoint folder: its config and what each stage is to hold."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"model_type": MODEL_TYPE}))
    (out / "probe.json").write_text(json.dumps(probe))
    return out
