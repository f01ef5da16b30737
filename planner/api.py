"""The planner's Python API: what ``omni-plan`` prints and what ``omni-worker`` launches from.

from planner.api import plan_spec
result = plan_spec("configs/models/qwen3-omni-30b-a3b-speech.yaml", "2xH100-80GB")
result.plan.fits, result.plan.model_dump_json()
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from planner.engine_plan import engine_plan
from planner.errors import PlannerError
from planner.estimate import StageFacts, stage_budget, stage_facts
from planner.inventory import Inventory, Node, resolve_inventory
from planner.loader import NodeKind, load_spec
from planner.overrides import Provenance
from planner.placement import Issue, NodeLayout, Placer, Unit, build_units
from planner.plan import (
    FleetTotals,
    GpuPlan,
    LaunchPlan,
    MemoryBudget,
    NodePlan,
    PlanError,
    ProcessPlan,
    ReplicaPlan,
    StagePlacement,
)
from planner.spec import Device, DType, ModelSpec

__all__ = ["PlanResult", "PlannerError", "build_plan", "plan_spec"]


@dataclass(frozen=True)
class PlanResult:
    spec: ModelSpec  # resolved: overrides applied
    spec_path: Path
    plan: LaunchPlan
    provenance: Provenance
    inventory: Inventory


def plan_spec(
    spec_path: Path | str,
    inventory: str | Path | Inventory | None = None,
    overrides: Sequence[str] = (),
    override_file: Path | None = None,
    *,
    max_replicas_per_node: int | None = None,
    model_dir: Path | None = None,
) -> PlanResult:
    """Load a spec (or a bare model directory), apply overrides, and plan it on ``inventory``.

    ``inventory``: ``None`` = this host without GPUs (named by ``socket.gethostname()``); a
    ``--gpus`` string such as ``"2xH100-80GB"``; a YAML inventory path; or an
    :class:`~planner.inventory.Inventory` (e.g. ``Inventory.from_devices(...)``).
    Raises :class:`~planner.errors.PlannerError` for invalid specs, overrides or inventories; a
    layout that does not fit is ``plan.fits == False`` with ``plan.errors``. ``model_dir``: a
    checkpoint directory that replaces the spec's own (see :mod:`planner.model_dir`).
    """
    inv = resolve_inventory(inventory)
    node = node_kind(inv, inventory)
    loaded = load_spec(spec_path, overrides, override_file, model_dir, node)
    if _cpu_only(inventory):
        moved = cpu_overrides(loaded.spec, overrides)
        if moved:  # the user's own overrides come last and win
            loaded = load_spec(spec_path, (*moved, *overrides), override_file, model_dir, node)
    plan = build_plan(loaded.spec, loaded.spec_path, inv, max_replicas_per_node)
    return PlanResult(loaded.spec, loaded.spec_path, plan, loaded.provenance, inv)


def _cpu_only(inventory: str | Path | Inventory | None) -> bool:
    return isinstance(inventory, str) and inventory.strip().lower() == "cpu"


def node_kind(inventory: Inventory, given: object = None) -> NodeKind:
    """What ``auto`` devices and dtypes resolve by: GPUs where any node of the inventory has
    them (a fleet's CPU-only nodes then hold no replica), else the CPU."""
    gpus = [g for n in inventory.nodes for g in n.gpus]
    if not gpus:
        return NodeKind(False, "a node without GPUs")
    label = given if isinstance(given, str) else ", ".join(sorted({g.name for g in gpus}))
    return NodeKind(True, f"a node with GPUs ({label})")


def cpu_overrides(spec: ModelSpec, given: Sequence[str] = ()) -> list[str]:
    """``--gpus cpu``: every stage of the spec on the CPU (a tiny checkpoint of a GPU model on
    a laptop or CI) in float32 (the spec's bf16 is a GPU's choice: on a CPU it is slow and
    diverges from the references), as ordinary overrides so that ``explain`` shows where they
    came from. A field the user overrides (``given``) is left to the user."""
    # given as "--stage.field value", "--stage.field=value" or "stage.field=value"
    named = {token.split("=", 1)[0].lstrip("-") for token in given}
    out: list[str] = []
    for name, stage in spec.stages.items():
        if stage.device.value == "cpu" or f"{name}.device" in named:
            continue
        wanted = {"device": "cpu", "gpus": "null", "dtype": "fp32"}
        if stage.memory_share is not None:
            wanted["memory_share"] = "null"
        if stage.tp_size != 1:
            wanted["tp_size"] = "1"
        for field, value in wanted.items():
            if f"{name}.{field}" not in named:
                out += [f"--{name}.{field}", value]
    return out


def spec_digest(spec: ModelSpec) -> str:
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()


def build_plan(
    spec: ModelSpec,
    spec_path: Path,
    inventory: Inventory,
    max_replicas_per_node: int | None = None,
) -> LaunchPlan:
    if max_replicas_per_node is not None and max_replicas_per_node < 1:
        raise PlannerError(f"max_replicas_per_node must be at least 1, got {max_replicas_per_node}")
    auto = [n for n, s in spec.stages.items() if s.device == Device.AUTO or s.dtype == DType.AUTO]
    if auto:
        raise PlannerError(
            f"stages {', '.join(auto)} have device or dtype auto, which the node resolves: "
            "load the spec with a node (planner.api.plan_spec, planner.loader.load_spec(node=))"
        )
    facts = {name: stage_facts(spec, spec_path, name) for name in spec.stages}
    units = build_units(spec, facts)
    placer = Placer(units, inventory.catalog)
    built: dict[tuple[str, ...], NodePlan] = {}  # identical nodes share one placement
    nodes: list[NodePlan] = []
    errors: list[PlanError] = []
    warnings: list[PlanError] = []
    for node in inventory.nodes:
        template = built.get(node.layout_key)
        if template is not None:
            nodes.append(template.model_copy(update={"node": node.name}))
            continue
        layout = placer.place(node, max_replicas_per_node)
        plan = _node_plan(node, layout, units, placer)
        nodes.append(plan)
        if layout.errors:  # error messages name the node: placed again for every node
            errors += [_plan_error(node, i) for i in layout.errors]
        else:
            built[node.layout_key] = plan
    warnings += _share_warnings(facts, inventory)
    total = sum(len(n.replicas) for n in nodes)
    if total and errors:
        # A fleet where some nodes hold a replica: the others are worth a warning, not a refusal.
        warnings += [
            e.model_copy(update={"message": f"{e.message} (node {e.node} holds no replica)"})
            for e in errors
        ]
        errors = []
    elif not total and not errors:
        errors.append(PlanError(node="", gpu=None, overflow_bytes=0, message="no replica fits"))
    return LaunchPlan(
        spec=spec.name,
        spec_digest=spec_digest(spec),
        fits=not errors,
        errors=errors,
        warnings=warnings,
        nodes=nodes,
        fleet=_fleet(nodes, inventory),
    )


def _plan_error(node: Node, issue: Issue) -> PlanError:
    return PlanError(
        node=node.name,
        gpu=issue.gpu,
        overflow_bytes=issue.overflow,
        message=issue.message,
        fixes=issue.fixes,
    )


def _share_warnings(facts: dict[str, StageFacts], inventory: Inventory) -> list[PlanError]:
    out = []
    types = {g.name: g for n in inventory.nodes for g in n.gpus}
    for f in facts.values():
        if not (f.is_engine and f.stage.memory_share and f.stage.device == Device.GPU):
            continue
        for gpu in types.values():
            b = stage_budget(f, gpu)
            want = f.stage.engine.max_running_requests * f.stage.engine.context_length
            if 0 < b.kv_tokens < want and not f.stage.engine.kv_budget_tokens:
                out.append(
                    PlanError(
                        node="",
                        gpu=None,
                        overflow_bytes=0,
                        message=(
                            f"stage {f.name}: memory_share {f.stage.memory_share} of {gpu.name} "
                            f"buys {b.kv_tokens:,} KV tokens, fewer than max_running_requests x "
                            f"context_length = {want:,}; requests beyond that queue"
                        ),
                    )
                )
    return out


def _add(a: MemoryBudget, b: MemoryBudget) -> MemoryBudget:
    return MemoryBudget(
        weights=a.weights + b.weights,
        kv_cache=a.kv_cache + b.kv_cache,
        activations=a.activations + b.activations,
        runtime=a.runtime + b.runtime,
    )


def _node_plan(node: Node, layout: NodeLayout, units: list[Unit], placer: Placer) -> NodePlan:
    by_stage: list[dict[str, MemoryBudget]] = [{} for _ in node.gpus]
    processes: list[ProcessPlan] = []
    replicas: list[ReplicaPlan] = []
    for r, assignment in enumerate(layout.replicas):
        names = []
        for u in units:
            gpus = list(assignment.get(u.group, ()))
            name = f"{r}/{u.group}"
            names.append(name)
            processes.append(_process(node, u, r, name, gpus, placer, by_stage))
        used = sorted({g for gs in assignment.values() for g in gs})
        replicas.append(ReplicaPlan(index=r, gpus=used, processes=names))
    gpu_plans = []
    for g, gpu in enumerate(node.gpus):
        planned = MemoryBudget()
        for b in by_stage[g].values():
            planned = _add(planned, b)
        gpu_plans.append(
            GpuPlan(
                index=g,
                name=gpu.name,
                capacity_bytes=gpu.memory_bytes,
                reserved_bytes=gpu.estimates.reserved_bytes,
                by_stage=by_stage[g],
                planned=planned,
            )
        )
    return NodePlan(node=node.name, gpus=gpu_plans, replicas=replicas, processes=processes)


def _process(
    node: Node,
    u: Unit,
    replica: int,
    name: str,
    gpus: list[int],
    placer: Placer,
    by_stage: list[dict[str, MemoryBudget]],
) -> ProcessPlan:
    stages: list[StagePlacement] = []
    per_gpu = MemoryBudget()
    fraction: float | None = None
    gpu = node.gpus[gpus[0]] if gpus else None
    if gpu is not None:
        cost = placer.cost(u, gpu)
        per_gpu = MemoryBudget(runtime=cost.runtime)
        fraction = gpu.allocator_fraction(cost.claimed)
    first = True
    for f in u.stages:
        on_gpu = f.stage.device == Device.GPU and gpu is not None
        if on_gpu:
            assert gpu is not None
            b = placer.cost(u, gpu).budgets[f.name]
            mem, tokens = b.memory, b.kv_tokens
            per_gpu = _add(per_gpu, mem)
            for g in gpus:
                rank = placer.cost(u, node.gpus[g])
                own = rank.budgets[f.name].memory
                if first:
                    own = own.model_copy(update={"runtime": rank.runtime})
                by_stage[g][f"{replica}/{f.name}"] = own
            first = False
        else:
            host = stage_budget(f, None)
            mem, tokens = host.memory, host.kv_tokens
        stages.append(
            StagePlacement(
                stage=f.name,
                dtype=f.stage.dtype.value,
                memory=mem,
                kv_tokens=tokens,
                max_running_requests=f.stage.engine.max_running_requests if f.is_engine else 0,
                params=f.params,
                buffers=f.buffers,
                kv_bytes_per_token=f.kv_bytes_per_token,
                memory_share=f.stage.memory_share,
                engine=engine_plan(f, gpu if on_gpu else None, tokens) if f.is_engine else None,
            )
        )
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}
    return ProcessPlan(
        name=name,
        group=u.group,
        replica=replica,
        stages=stages,
        device="gpu" if gpus else "cpu",
        gpus=gpus,
        tp_size=u.tp,
        env=env,
        memory_per_gpu=per_gpu,
        cuda_context_bytes=gpu.estimates.cuda_context_bytes if gpu is not None else 0,
        allocator_fraction=fraction,
    )


def _fleet(nodes: list[NodePlan], inventory: Inventory) -> FleetTotals:
    planned = MemoryBudget()
    by_type: dict[str, int] = {}
    for plan, node in zip(nodes, inventory.nodes, strict=True):
        for g in plan.gpus:
            planned = _add(planned, g.planned)
        key = _node_kind(node)
        by_type[key] = by_type.get(key, 0) + len(plan.replicas)
    return FleetTotals(
        nodes=len(nodes),
        gpus=sum(len(n.gpus) for n in nodes),
        replicas=sum(len(n.replicas) for n in nodes),
        capacity_bytes=sum(g.capacity_bytes for n in nodes for g in n.gpus),
        planned=planned,
        replicas_by_gpu_type=by_type,
    )


def _node_kind(node: Node) -> str:
    if not node.gpus:
        return "cpu"
    counts: dict[str, int] = {}
    for g in node.gpus:
        counts[g.name] = counts.get(g.name, 0) + 1
    return ",".join(f"{c}x{n}" for n, c in counts.items())
