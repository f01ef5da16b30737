"""A minimal node plan for CPU-only pipelines: one replica, one process per process group.

The planner (``planner.api.plan_spec``) is the real source of plans; this stands in where a
plan is needed without GPUs or memory accounting (tests, benchmarks, a CPU-only fallback).
"""

from __future__ import annotations

from planner.plan import NodePlan, ProcessPlan, ReplicaPlan, StagePlacement
from planner.spec import ModelSpec


def cpu_node_plan(
    spec: ModelSpec, node: str = "local", groups: dict[str, list[str]] | None = None
) -> NodePlan:
    """``groups`` (process name -> stages) overrides the spec's process groups."""
    if groups:
        spec.check_processes(groups)  # (the spec's own grouping was checked with the spec)
    else:
        groups = spec.process_groups()
    processes = [
        ProcessPlan(
            name=f"0/{group}",
            group=group,
            replica=0,
            stages=[
                StagePlacement(
                    stage=s,
                    dtype=spec.stages[s].dtype.on("cpu").value,
                    max_running_requests=spec.stages[s].engine.max_running_requests,
                )
                for s in stages
            ],
            device="cpu",
            tp_size=max(spec.stages[s].tp_size for s in stages),
        )
        for group, stages in groups.items()
    ]
    return NodePlan(
        node=node,
        gpus=[],
        replicas=[ReplicaPlan(index=0, gpus=[], processes=[p.name for p in processes])],
        processes=processes,
    )
