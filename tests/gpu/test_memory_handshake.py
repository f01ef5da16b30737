"""The memory handshake between the plan and SGLang on GPU hosts, proven on this CPU: the
shipped layouts' processes load onto simulated GPUs (``tests/gpu/simulated.py``) in every order,
each engine's KV pool sized by SGLang's own ``KVCacheConfigurator`` under the worker's server
arguments and the vendor layer's patch, each process capped by the worker's own budget. Every
pool is the plan's, no process holds more than its footprint, and the GPU holds them all; a
GPU whose memory another tenant holds fails at start naming the plan's bytes, the free bytes and
the holder. Each layout prints its pools (``pytest -s tests/gpu``)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from planner.api import plan_spec
from tests.gpu.simulated import (
    GIB,
    GpuLayout,
    OutOfMemory,
    SimulatedGpu,
    engine_pools,
    load,
    planned_pool,
    schedules,
)
from worker.engines.gpu_memory import GpuBudgetError, Holder

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "configs" / "models"

# layout -> (spec, GPUs or inventory, the node simulated)
LAYOUTS = {
    "Qwen3-Omni speech on 2xH100": ("qwen3-omni-30b-a3b-speech.yaml", "2xH100-80GB", None),
    "Qwen3-Omni colocated on 1xH100": (
        "qwen3-omni-30b-a3b-speech-colocated.yaml", "1xH100-80GB", None,
    ),
    "Qwen3-TTS 1.7B on 1xH100": ("qwen3-tts-12hz-1.7b.yaml", "1xH100-80GB", None),
    "Qwen3-ASR 0.6B on 1xH100": ("qwen3-asr-0.6b.yaml", "1xH100-80GB", None),
    # a fleet's plan: four ASR engines (four replicas) on each L40S of the mixed fleet
    "fleet: Qwen3-ASR 0.6B, an L40S node": (
        "qwen3-asr-0.6b.yaml", str(REPO / "configs" / "inventories" / "mixed-fleet.yaml"), "l40s-0",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def sglang() -> None:
    from worker.engines import sglang as vendor

    vendor.load()


def _layouts(name: str) -> list[GpuLayout]:
    spec, inventory, node_name = LAYOUTS[name]
    planned = plan_spec(MODELS / spec, inventory)
    assert planned.plan.fits, planned.plan.errors
    node = next(n for n in planned.plan.nodes if node_name in (None, n.node))
    return [
        GpuLayout.of(planned.spec, planned.spec_path, node, g.index)
        for g in node.gpus
        if any(g.index in p.gpus for p in node.processes)
    ]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_pool_is_the_plans_whatever_order_the_processes_load_in(
    name: str, sglang: None
) -> None:
    rows = []
    failures = []
    for layout in _layouts(name):
        pools = engine_pools(layout)
        got: dict[tuple[str, str], set[tuple[int, int]]] = defaultdict(set)
        peaks: dict[str, int] = defaultdict(int)
        runs = 0
        for label, order in schedules(len(layout.processes)):
            try:
                gpu, loaded = load(layout, pools, order)
            except (OutOfMemory, GpuBudgetError, RuntimeError, ValueError) as exc:
                failures.append(f"GPU {layout.gpu.index}, {label}: {exc}")
                continue
            runs += 1
            for done in loaded:
                assert done.proc is not None
                for stage, pool in done.pools.items():
                    got[(done.plan.name, stage)].add(pool)
                peaks[done.plan.name] = max(peaks[done.plan.name], done.proc.peak)
                assert done.proc.peak <= done.budget.footprint_bytes, (label, done.plan.name)
            assert gpu.free() >= 0
            assert sum(p.peak for p in gpu.processes) <= layout.gpu.capacity_bytes
        for p in layout.processes:
            for placed in p.stages:
                if placed.engine is None:
                    continue
                pools_seen = got[(p.name, placed.stage)]
                tokens = sorted(t for t, _ in pools_seen)
                rows.append(
                    f"{name:<36} GPU {layout.gpu.index} {p.name:<16} {placed.stage:<11} "
                    f"plan {placed.kv_tokens:>7,} tokens {placed.engine.kv_bytes / GIB:6.2f} GiB | "
                    f"SGLang {tokens[0] if tokens else 0:>7,}..{tokens[-1] if tokens else 0:>7,}"
                    f" tokens in {runs} loading orders | peak {peaks[p.name] / GIB:6.2f} of "
                    f"{p.memory_per_gpu.total / GIB:6.2f} GiB planned"
                )
                assert pools_seen <= {planned_pool(placed)}, (p.name, placed.stage, pools_seen)
    print("\n" + "\n".join(rows))
    assert not failures, f"{len(failures)} loading orders failed:\n" + "\n".join(failures[:8])
    assert rows


def test_a_gpu_held_by_another_tenant_fails_at_start_naming_the_holder(sglang: None) -> None:
    """One Qwen3-ASR process on an H100 of which another tenant holds 76 GiB: its weights fit
    in what is left, its KV pool does not, and the stage fails before SGLang allocates the pool,
    naming the plan's bytes, the free bytes and the holder."""
    planned = plan_spec(MODELS / "qwen3-asr-0.6b.yaml", "1xH100-80GB", max_replicas_per_node=1)
    node = planned.plan.nodes[0]
    layout = GpuLayout.of(planned.spec, planned.spec_path, node, 0)
    tenant = Holder(424242, "other-tenant", 76 * GIB)
    gpu = SimulatedGpu(layout.gpu.capacity_bytes, (tenant,))
    with pytest.raises(GpuBudgetError) as failed:
        load(layout, engine_pools(layout), [0] * 6, gpu=gpu)
    message = str(failed.value)
    footprint = layout.processes[0].memory_per_gpu.total
    assert f"the plan gives it {footprint / GIB:.2f} GiB of cuda:0 (H100-80GB" in message
    assert f"but {(gpu.free()) / GIB:.2f} GiB is free" in message
    assert "pid 424242 (other-tenant) 76.00 GiB" in message
    assert "KV pool of 65,536 tokens" in message
    (proc,) = gpu.processes
    assert proc.reserved == layout.processes[0].stages[0].memory.weights  # (no pool allocated)


def test_a_process_past_its_footprint_fails_in_itself(sglang: None) -> None:
    """The allocator cap is the footprint less the CUDA context: everything the plan counts in
    the process (its runtime's workspaces and CUDA graphs included) fits under it, an
    allocation past it (the cap is rounded up a millionth of the GPU) fails in that process,
    before its neighbours are starved."""
    planned = plan_spec(MODELS / "qwen3-omni-30b-a3b-speech-colocated.yaml", "1xH100-80GB")
    layout = GpuLayout.of(planned.spec, planned.spec_path, planned.plan.nodes[0], 0)
    n = len(layout.processes)
    gpu, loaded = load(layout, engine_pools(layout), [i for i in range(n) for _ in range(6)])
    thinker = next(done for done in loaded if done.plan.group == "thinker")
    assert thinker.proc is not None and thinker.proc.cap is not None
    assert thinker.proc.cap + thinker.proc.context == pytest.approx(
        thinker.budget.footprint_bytes, abs=thinker.budget.capacity_bytes * 1e-6
    )
    room = thinker.proc.cap - thinker.proc.reserved
    with pytest.raises(OutOfMemory, match="past the allocator's cap"):
        gpu.alloc(thinker.proc, room + (2 << 20), "an activation past the plan")
