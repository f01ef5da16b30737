"""The stage process: loads its stages' executors and drives them: messages from the
coordinator's queue go to the executors (through ``dispatch.Dispatcher``, which also hands
outputs between this process's own stages in place), every stage steps when it has work.

Deliberately imports nothing heavy at module level: the process applies its plan's environment
(``CUDA_VISIBLE_DEVICES``, thread counts) before torch is imported.
"""

from __future__ import annotations

import os
import queue
import resource
import signal
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.plan import EnginePlan, NodePlan, ProcessPlan
from worker.engines.gpu_memory import GpuBudget
from worker.stages import messages as m

LOAD_INTERVAL = 0.1  # seconds between load reports
IDLE_WAIT = 0.05


@dataclass(slots=True)
class HostConfig:
    process: str
    spec_json: str
    checkpoint: str
    stages: list[str]
    device: str  # torch device
    env: dict[str, str] = field(default_factory=dict)
    threads: int = 1
    shm_prefix: str = "omni"
    max_running: dict[str, int] = field(default_factory=dict)
    kv_tokens: dict[str, int] = field(default_factory=dict)  # 0 / absent: no limit
    engines: dict[str, EnginePlan] = field(default_factory=dict)  # its SGLang engines, planned
    # what the plan gives the process on its GPU (None: on the CPU): its allocator is capped
    # at it, and each KV pool is sized from the plan once the GPU has the rest free
    budget: GpuBudget | None = None
    families: tuple[str, ...] = ()  # model families from outside worker/models/ (registry.add)

    @classmethod
    def of_process(
        cls,
        pp: ProcessPlan,
        node: NodePlan,
        spec_json: str,
        checkpoint: str,
        *,
        threads: int,
        shm_prefix: str,
        families: tuple[str, ...] = (),
    ) -> HostConfig:
        """The stage process the plan's ``pp`` is: its stages, its GPUs (the first of them as
        ``cuda:0``: the process sees its plan's GPUs only), what the plan gives each stage and
        the process's budget on its GPUs."""
        on_gpu = pp.device == "gpu" and bool(pp.gpus)
        return cls(
            process=pp.name,
            spec_json=spec_json,
            checkpoint=checkpoint,
            stages=[sp.stage for sp in pp.stages],
            device="cuda:0" if on_gpu else "cpu",
            env=dict(pp.env),
            threads=threads,
            shm_prefix=shm_prefix,
            max_running={sp.stage: sp.max_running_requests for sp in pp.stages},
            kv_tokens={sp.stage: sp.kv_tokens for sp in pp.stages},
            engines={sp.stage: sp.engine for sp in pp.stages if sp.engine is not None},
            budget=GpuBudget.of(pp, node.gpus[pp.gpus[0]]) if on_gpu else None,
            families=families,
        )


class _Busy:
    """Fraction of recent wall time spent in ``step`` (exponential decay, ~1 s)."""

    def __init__(self) -> None:
        self.value = 0.0
        self.last = time.monotonic()
        self.acc = 0.0

    def add(self, seconds: float) -> None:
        self.acc += seconds

    def sample(self) -> float:
        now = time.monotonic()
        dt = max(now - self.last, 1e-6)
        frac = min(1.0, self.acc / dt)
        alpha = min(1.0, dt / 1.0)
        self.value += alpha * (frac - self.value)
        self.acc, self.last = 0.0, now
        return self.value


def peak_bytes(device: str) -> int:
    """The most this process has held: the caching allocator's reserved peak on a GPU (what
    counts against its share), the resident set's peak on the CPU."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.max_memory_reserved(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def stage_device(declared: str, process_device: str) -> str:
    """Where a stage runs: a stage declared ``cpu`` runs on the CPU wherever its process runs
    (the planner counts it as host memory), others on their process's device. The 1.7B TTS
    spec's preprocessing (Mimi's encoder) shares a GPU process with its talker."""
    return "cpu" if declared == "cpu" else process_device


def host_main(cfg: HostConfig, inbox: Any, outbox: Any) -> None:
    # A Ctrl-C or SIGTERM sent to the whole process group is the worker's to handle: it drains
    # and then stops its stages itself (STOP, else SIGKILL); a stage process also exits when
    # its coordinator is gone. Dying at once here would fail the requests being drained.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.environ.update(cfg.env)
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg.threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from worker.runtime import transport

    transport.set_prefix(cfg.shm_prefix)
    try:
        spec, executors = _load(cfg, outbox)
    except Exception:
        outbox.send([(m.FATAL, traceback.format_exc())])
        return
    _serve(executors, spec, inbox, outbox, cfg.device)


def _load(cfg: HostConfig, outbox: Any) -> tuple[Any, dict[str, Any]]:
    import torch
    from transformers.utils import logging as hf_logging

    from planner.spec import Executor, ModelSpec
    from worker.contract.stage_context import StageContext
    from worker.models import registry

    torch.set_num_threads(cfg.threads)
    if cfg.device.startswith("cuda") and cfg.budget is not None:
        # several processes may share one GPU: each stays within its footprint, and an
        # allocation past it fails in that process instead of starving its neighbours
        from worker.engines import gpu_memory

        gpu_memory.apply(cfg.budget, cfg.device)
    hf_logging.disable_progress_bar()  # stage logs are progress lines, not tqdm bars
    spec = ModelSpec.model_validate_json(cfg.spec_json)
    registry.add(*cfg.families)
    executors: dict[str, Any] = {}
    for name in cfg.stages:
        stage = spec.stages[name]
        ctx = StageContext(
            name=name,
            spec=spec,
            stage=stage,
            checkpoint=Path(cfg.checkpoint),
            device=stage_device(stage.device.value, cfg.device),
            max_running_requests=cfg.max_running.get(name) or stage.engine.max_running_requests,
            kv_tokens=cfg.kv_tokens.get(name, 0),
            engine=cfg.engines.get(name),
        )
        outbox.send([(m.PROGRESS, f"{cfg.process}: loading {name}")])
        ex = registry.make_executor(ctx)
        ex.load()
        if stage.executor == Executor.AUTOREGRESSIVE:
            outbox.send([(m.PROGRESS, f"{cfg.process}: {name} {_engine_line(ctx)}")])
        outbox.send([(m.PROGRESS, f"{cfg.process}: warming up {name}")])
        ex.warmup()
        executors[name] = ex
    outbox.send([(m.READY, name) for name in executors])
    return spec, executors


def _engine_line(ctx: Any) -> str:
    """What the worker's log says of a stage's SGLang engine once it runs."""
    plan = ctx.engine
    ranks = ctx.stage.tp_size
    return (
        f"runs on SGLang: {ctx.dtype} on {ctx.device}, "
        + (f"{plan.attention_backend} attention, " if plan is not None else "")
        + f"{ranks} tensor-parallel rank{'s' if ranks > 1 else ''}"
        + (f", a KV pool of {ctx.kv_tokens:,} tokens" if ctx.kv_tokens else "")
    )


def _serve(executors: dict[str, Any], spec: Any, inbox: Any, outbox: Any, device: str) -> None:
    from worker.runtime.dispatch import Dispatcher

    dispatch = Dispatcher(spec, executors)
    busy = {name: _Busy() for name in executors}
    last_load = 0.0
    parent = os.getppid()
    while True:
        if os.getppid() != parent:  # the coordinator died (SIGKILL): do not linger as an orphan
            return
        now = time.monotonic()
        deadlines = [d for d in (ex.next_deadline() for ex in executors.values()) if d is not None]
        timeout = IDLE_WAIT if not deadlines else max(0.0, min(deadlines) - now)
        msgs = []
        try:
            msgs.extend(inbox.get(timeout=timeout) if timeout > 0 else inbox.get_nowait())
            while True:
                msgs.extend(inbox.get_nowait())
        except queue.Empty:
            pass
        for msg in msgs:
            kind = msg[0]
            if kind == m.STOP:
                return
            if kind == m.OPEN:
                dispatch.open(msg[1], msg[2])
            elif kind == m.CLOSE:
                dispatch.close(msg[1])
            else:  # INPUT / CHUNK / END: (kind, stage, rid, src, payload)
                dispatch.receive(*msg)
        for name, ex in executors.items():
            d = ex.next_deadline()
            if d is None or d > time.monotonic():
                continue
            t0 = time.perf_counter()
            produced = ex.step()
            busy[name].add(time.perf_counter() - t0)
            dispatch.emit(name, produced)
        outs = dispatch.take()
        now = time.monotonic()
        if now - last_load >= LOAD_INTERVAL:
            last_load = now
            load = {n: (ex.queue_depth(), busy[n].sample()) for n, ex in executors.items()}
            outs.append((m.LOAD, load, dispatch.traffic_report(), peak_bytes(device)))
        if outs:
            outbox.send(outs)
