"""Placing one pipeline replica (and then as many as fit) onto a node's GPUs.

Rules, in order:
* pinned layouts (every GPU stage lists ``gpus``) are checked as written; further replicas on
  the same node repeat the layout shifted by its width (pins 0,1 -> 2,3 -> ...);
* otherwise each process is placed automatically: tensor-parallel ranks on distinct GPUs of the
  node, streaming neighbours on the same GPU where that fits, the fewest GPUs per replica
  (contiguous index windows, smallest first), then as many replicas per node as fit;
* engines may share a GPU: each one's KV pool is the plan's, in tokens and bytes, whatever else
  runs there (the worker sizes SGLang's pool from the plan, not from the GPU's free memory); a
  stage that declares ``memory_share`` (a *colocated* layout's published profile) gets the KV
  pool its share leaves over. Shares, budgets, per-process runtime and the reserve must fit.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from planner.catalog import Catalog, GpuType
from planner.estimate import StageBudget, StageFacts, process_runtime, stage_budget
from planner.inventory import Node
from planner.spec import Device, ModelSpec
from planner.units import exact, gib


@dataclass(frozen=True)
class Unit:
    """One process group of the spec (the same in every replica)."""

    group: str
    stages: tuple[StageFacts, ...]
    device: Device
    tp: int
    pins: tuple[int, ...] | None
    neighbours: frozenset[str]

    @property
    def gpu_stages(self) -> tuple[StageFacts, ...]:
        return tuple(f for f in self.stages if f.stage.device == Device.GPU)


@dataclass(frozen=True)
class UnitCost:
    budgets: dict[str, StageBudget]  # per stage, per rank
    runtime: int
    claimed: int  # bytes the process holds on each of its GPUs (shares count in full)
    problems: tuple[str, ...] = ()  # a share too small for the stage


@dataclass
class Issue:
    gpu: int | None
    overflow: int
    message: str
    fixes: list[str] = field(default_factory=list)


@dataclass
class NodeLayout:
    replicas: list[dict[str, tuple[int, ...]]] = field(default_factory=list)
    errors: list[Issue] = field(default_factory=list)
    warnings: list[Issue] = field(default_factory=list)


def build_units(spec: ModelSpec, facts: dict[str, StageFacts]) -> list[Unit]:
    groups = spec.process_groups()
    owner = {s: g for g, names in groups.items() for s in names}
    units = []
    for group, names in groups.items():
        stages = tuple(facts[n] for n in names)
        gpu = [f for f in stages if f.stage.device == Device.GPU]
        neighbours = set()
        for name in names:
            st = spec.stages[name]
            neighbours |= {owner[t] for t in st.stream_to}
            neighbours |= {owner[s] for s, o in spec.stages.items() if name in o.stream_to}
        neighbours.discard(group)
        pins = next((tuple(f.stage.gpus) for f in gpu if f.stage.gpus is not None), None)
        units.append(
            Unit(
                group=group,
                stages=stages,
                device=Device.GPU if gpu else Device.CPU,
                # (a CPU process's: its autoregressive stage's SGLang ranks, one process each)
                tp=max((f.stage.tp_size for f in (gpu or stages)), default=1),
                pins=pins,
                neighbours=frozenset(neighbours),
            )
        )
    return units


class Placer:
    """Places replicas of one spec; costs are cached per (process group, GPU type)."""

    def __init__(self, units: list[Unit], catalog: Catalog) -> None:
        self.units = units
        self.gpu_units = [u for u in units if u.device == Device.GPU]
        self.catalog = catalog
        self._costs: dict[tuple[str, str, int], UnitCost] = {}
        # The loader guarantees that either every GPU stage is pinned or none is.
        self.pinned = any(u.pins is not None for u in self.gpu_units)

    def cost(self, unit: Unit, gpu: GpuType) -> UnitCost:
        key = (unit.group, gpu.name, gpu.memory_bytes)
        hit = self._costs.get(key)
        if hit is not None:
            return hit
        budgets = {f.name: stage_budget(f, gpu) for f in unit.gpu_stages}
        runtime = process_runtime(list(unit.gpu_stages), gpu)
        problems = []
        claimed = runtime
        for f in unit.gpu_stages:
            b = budgets[f.name]
            if b.share_bytes is None:
                claimed += b.memory.total
                continue
            claimed += b.share_bytes
            fixed = b.memory.weights + b.memory.activations
            if fixed > b.share_bytes:
                problems.append(
                    f"stage {f.name}: weights {gib(b.memory.weights)} + activations "
                    f"{gib(b.memory.activations)} exceed its memory_share {f.stage.memory_share} "
                    f"of {gpu.name} ({gib(b.share_bytes)}) by {exact(fixed - b.share_bytes)}"
                )
            elif f.is_engine and b.kv_tokens < f.stage.engine.context_length:
                problems.append(
                    f"stage {f.name}: memory_share {f.stage.memory_share} of {gpu.name} leaves KV "
                    f"room for {b.kv_tokens:,} tokens, less than one request of context_length "
                    f"{f.stage.engine.context_length:,}"
                )
        cost = UnitCost(budgets, runtime, claimed, tuple(problems))
        self._costs[key] = cost
        return cost

    # ---- one node -------------------------------------------------------------------------

    def place(self, node: Node, max_replicas: int | None = None) -> NodeLayout:
        layout = NodeLayout()
        if not self.gpu_units:
            # CPU-only pipelines: one replica per node; they do not compete for GPU memory.
            layout.replicas.append({u.group: () for u in self.units})
            return layout
        if not node.gpus:
            facts = [f for u in self.gpu_units for f in u.gpu_stages]
            stages = [f.name for f in facts]
            to_cpu = [f"--{f.name}.device cpu" for f in facts]
            to_cpu += [f"--{f.name}.gpus null" for f in facts if f.stage.gpus is not None]
            layout.errors.append(
                Issue(
                    None,
                    0,
                    f"node {node.name} has no GPUs, but stages {', '.join(stages)} run on gpu",
                    [
                        "plan for a GPU host: --gpus 1xH100-80GB or --inventory FILE",
                        "run on the CPU: " + " ".join(to_cpu),
                    ],
                )
            )
            return layout
        free = [g.usable_bytes for g in node.gpus]
        place_one = self._pinned if self.pinned else self._auto
        while max_replicas is None or len(layout.replicas) < max_replicas:
            first = not layout.replicas
            assignment, issues = place_one(node, free, len(layout.replicas), diagnose=first)
            if assignment is None:
                if first:
                    layout.errors.extend(issues)
                break
            for u in self.gpu_units:
                for g in assignment[u.group]:
                    free[g] -= self.cost(u, node.gpus[g]).claimed
            for u in self.units:
                assignment.setdefault(u.group, ())
            layout.replicas.append(assignment)
        return layout

    def _pinned(
        self, node: Node, free: list[int], replica: int, diagnose: bool
    ) -> tuple[dict[str, tuple[int, ...]] | None, list[Issue]]:
        width = max(max(u.pins or (0,)) for u in self.gpu_units) + 1
        offset = replica * width
        n = len(node.gpus)
        if offset + width > n:
            if not diagnose:
                return None, []
            return None, [
                Issue(
                    None,
                    0,
                    f"the spec pins GPU {width - 1}, but node {node.name} has {n} GPU(s)",
                    ["pin lower GPU indices (--<stage>.gpus [0])", f"plan for {width} GPUs"],
                )
            ]
        assignment = {u.group: tuple(p + offset for p in u.pins or ()) for u in self.gpu_units}
        used: dict[int, int] = defaultdict(int)
        on_gpu: dict[int, list[Unit]] = defaultdict(list)
        issues: list[Issue] = []
        for u in self.gpu_units:
            for g in assignment[u.group]:
                cost = self.cost(u, node.gpus[g])
                used[g] += cost.claimed
                on_gpu[g].append(u)
                for p in cost.problems:
                    issues.append(Issue(g, 0, f"node {node.name} GPU {g}: {p}"))
        for g in sorted(used):
            over = used[g] - free[g]
            if over > 0:
                issues.append(self._overflow(node, g, on_gpu[g], used[g], over))
        if issues:
            return None, issues if diagnose else []
        return assignment, []

    def _auto(
        self, node: Node, free: list[int], replica: int, diagnose: bool
    ) -> tuple[dict[str, tuple[int, ...]] | None, list[Issue]]:
        n = len(node.gpus)
        kmin = max(u.tp for u in self.gpu_units)
        if kmin > n:
            if not diagnose:
                return None, []
            big = [u.group for u in self.gpu_units if u.tp > n]
            return None, [
                Issue(
                    None,
                    0,
                    f"tp_size {kmin} of {', '.join(big)} needs {kmin} GPUs in one node; node "
                    f"{node.name} has {n}",
                    [f"a node with {kmin} GPUs", f"lower tp_size: --{big[0]}.tp_size {n}"],
                )
            ]
        for k in range(kmin, n + 1):
            for start in range(0, n - k + 1):
                got, _ = self._pack(node, free, list(range(start, start + k)))
                if got is not None:
                    return got, []
        if not diagnose:
            return None, []
        _, issue = self._pack(node, free, list(range(n)))
        return None, [issue] if issue else []

    def _order(self) -> list[Unit]:
        def size(u: Unit) -> int:
            return max(sum(f.weight_bytes_rank for f in u.gpu_stages), 0)

        return sorted(self.gpu_units, key=lambda u: (-u.tp, -size(u), u.group))

    def _pack(
        self, node: Node, free: list[int], window: list[int]
    ) -> tuple[dict[str, tuple[int, ...]] | None, Issue | None]:
        used: dict[int, int] = defaultdict(int)
        on_gpu: dict[int, list[Unit]] = defaultdict(list)
        assignment: dict[str, tuple[int, ...]] = {}
        for u in self._order():
            ok = []
            for g in window:
                cost = self.cost(u, node.gpus[g])
                if cost.problems:
                    return None, Issue(g, 0, f"node {node.name} GPU {g}: {cost.problems[0]}")
                if free[g] - used[g] < cost.claimed:
                    continue
                ok.append(g)
            near = {g for g in ok if any(x.group in u.neighbours for x in on_gpu[g])}
            ok.sort(key=lambda g: (g not in near, window.index(g)))
            if len(ok) < u.tp:
                return None, self._unplaced(node, free, used, window, u)
            for g in ok[: u.tp]:
                used[g] += self.cost(u, node.gpus[g]).claimed
                on_gpu[g].append(u)
            assignment[u.group] = tuple(sorted(ok[: u.tp]))
        return assignment, None

    def _unplaced(
        self,
        node: Node,
        free: list[int],
        used: dict[int, int],
        window: list[int],
        u: Unit,
    ) -> Issue:
        room = sorted(window, key=lambda g: -(free[g] - used[g]))
        g = room[min(u.tp, len(room)) - 1]
        need = self.cost(u, node.gpus[g]).claimed
        over = need - (free[g] - used[g])
        return self._overflow(node, g, [u], need, max(over, 1), free_bytes=free[g] - used[g])

    def _overflow(
        self,
        node: Node,
        g: int,
        units: list[Unit],
        need: int,
        over: int,
        free_bytes: int | None = None,
    ) -> Issue:
        gpu = node.gpus[g]
        names = ", ".join(u.group for u in units)
        if free_bytes is None:
            what = (
                f"node {node.name} GPU {g} ({gpu.name}): processes {names} need {exact(need)} "
                f"but {exact(gpu.usable_bytes)} is usable "
                f"({gib(gpu.memory_bytes)} minus {gib(gpu.estimates.reserved_bytes)} reserved)"
            )
        else:
            what = (
                f"node {node.name} GPU {g} ({gpu.name}): process {names} needs {exact(need)} per "
                f"GPU but at most {exact(max(free_bytes, 0))} is free there"
            )
        owner, biggest = max(
            ((u, f) for u in units for f in u.gpu_stages), key=lambda uf: uf[1].weight_bytes_rank
        )
        fixes = self._fixes(owner, biggest, gpu, over, need)
        return Issue(g, over, f"{what}; overflow {exact(over)}", fixes)

    def _tp_fix(self, unit: Unit, f: StageFacts) -> str:
        """Doubling TP for every GPU stage of the process (they share its GPUs), with new pins
        beyond the pinned layout's width when the spec pins GPUs."""
        tp = unit.tp * 2
        parts = [f"--{s.name}.tp_size {tp}" for s in unit.gpu_stages]
        if unit.pins is not None:
            width = max(max(u.pins or (0,)) for u in self.gpu_units) + 1
            pins = [*unit.pins, *range(width, width + unit.tp)]
            parts += [f"--{s.name}.gpus [{','.join(map(str, pins))}]" for s in unit.gpu_stages]
        return (
            f"more TP: {' '.join(parts)} (weights {gib(f.weight_bytes_rank)} and KV split over "
            f"{tp} GPUs)"
        )

    def _fixes(self, unit: Unit, f: StageFacts, gpu: GpuType, over: int, need: int) -> list[str]:
        s, st = f.name, f.stage
        fixes = []
        if st.memory_share is not None:
            grow = st.memory_share + over / gpu.memory_bytes
            fixes.append(f"a larger share: --{s}.memory_share {min(grow + 0.005, 1):.3f}")
        if f.is_engine or f.weight_bytes_rank > over:
            fixes.append(self._tp_fix(unit, f))
        if st.dtype.bytes > 1 and f.weight_bytes_rank:
            saved = f.weight_bytes_rank - f.weight_bytes_rank // st.dtype.bytes
            fixes.append(f"fp8 weights: --{s}.dtype fp8 saves {gib(saved)} per GPU")
        if f.is_engine and st.memory_share is None:
            e = st.engine
            per_req = e.context_length * f.kv_bytes_per_token_rank
            kv = f.required_kv_tokens * f.kv_bytes_per_token_rank
            if per_req and kv > over:
                n = (kv - over) // per_req
                if n >= 1 and n < e.max_running_requests and not e.kv_budget_tokens:
                    fixes.append(
                        f"fewer running requests: --{s}.engine.max_running_requests {n} "
                        f"(saves {gib((e.max_running_requests - n) * per_req)})"
                    )
                elif e.kv_budget_tokens:
                    tokens = (kv - over) // f.kv_bytes_per_token_rank
                    fixes.append(f"a smaller KV budget: --{s}.engine.kv_budget_tokens {tokens}")
        bigger = sorted(
            (t for t in self.catalog.gpus.values() if t.usable_bytes >= need),
            key=lambda t: t.memory_bytes,
        )
        if bigger:
            fixes.append(f"another GPU: {bigger[0].name} ({gib(bigger[0].usable_bytes)} usable)")
        return fixes
