"""Presenting a plan: rich tables for people, an SVG of each GPU's memory."""

from __future__ import annotations

import colorsys
import html
from collections.abc import Iterable

from rich.console import Console
from rich.table import Table

from planner.plan import LaunchPlan, MemoryBudget, NodePlan
from planner.units import gib

CATEGORIES = ("weights", "kv_cache", "activations", "runtime")


def distinct_layouts(plan: LaunchPlan) -> list[tuple[NodePlan, list[str]]]:
    """Nodes grouped by identical layout: (first node, names of all nodes with that layout)."""
    groups: dict[str, tuple[NodePlan, list[str]]] = {}
    for node in plan.nodes:
        key = node.model_dump_json(exclude={"node"})
        if key in groups:
            groups[key][1].append(node.node)
        else:
            groups[key] = (node, [node.node])
    return list(groups.values())


def _g(n: int) -> str:
    return f"{n / 2**30:,.2f}"


def print_plan(plan: LaunchPlan, console: Console, spec_label: str) -> None:
    verdict = "[green]fits[/green]" if plan.fits else "[bold red]does not fit[/bold red]"
    console.print(
        f"[bold]{plan.spec}[/bold] ({spec_label}): {verdict}, {plan.replicas} replica(s) on "
        f"{len(plan.nodes)} node(s); plan v{plan.version}, spec digest {plan.spec_digest[:12]}"
    )
    if len(plan.nodes) > 1:
        _fleet_table(plan, console)
    for node, names in distinct_layouts(plan):
        label = node.node if len(names) == 1 else f"{node.node} (and {len(names) - 1} identical)"
        if node.gpus and node.replicas:
            _gpu_table(node, label, console)
        if node.processes:
            _process_table(node, label, console)
            _engine_table(node, label, console)
    for w in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {w.message}", highlight=False)
        for fix in w.fixes:
            console.print(f"  fix: {fix}", highlight=False)
    for e in plan.errors:
        console.print(f"[bold red]error:[/bold red] {e.message}", highlight=False)
        for fix in e.fixes:
            console.print(f"  fix: {fix}", highlight=False)


def _fleet_table(plan: LaunchPlan, console: Console) -> None:
    t = Table(title="Fleet", title_justify="left")
    for col in (
        "nodes",
        "GPUs",
        "replicas",
        "capacity GiB",
        "planned GiB",
        "replicas by node kind",
    ):
        t.add_column(col, justify="right" if col != "replicas by node kind" else "left")
    f = plan.fleet
    by_kind = ", ".join(f"{k}: {v}" for k, v in f.replicas_by_gpu_type.items())
    t.add_row(
        str(f.nodes),
        str(f.gpus),
        str(f.replicas),
        _g(f.capacity_bytes),
        _g(f.planned.total),
        by_kind,
    )
    console.print(t)
    per = Table(title="Nodes (identical layouts grouped; per node)", title_justify="left")
    for col in ("nodes", "count", "GPUs", "replicas", "planned GiB", "headroom GiB"):
        per.add_column(col, justify="left" if col == "nodes" else "right")
    for n, names in distinct_layouts(plan):
        kinds: dict[str, int] = {}
        for g in n.gpus:
            kinds[g.name] = kinds.get(g.name, 0) + 1
        per.add_row(
            names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}",
            str(len(names)),
            ", ".join(f"{c}x{k}" for k, c in kinds.items()) or "cpu",
            str(len(n.replicas)),
            _g(sum(g.planned.total for g in n.gpus)),
            _g(sum(g.headroom_bytes for g in n.gpus)),
        )
    console.print(per)


def _gpu_table(node: NodePlan, label: str, console: Console) -> None:
    t = Table(title=f"GPUs of {label} (GiB)", title_justify="left")
    for col in ("GPU", "type", "capacity", "weights", "KV", "activ.", "runtime", "planned",
                "reserved", "headroom", "stages"):  # fmt: skip
        if col == "stages":
            t.add_column(col, overflow="fold")
        else:
            t.add_column(col, justify="left" if col == "type" else "right", no_wrap=True)
    for g in node.gpus:
        p = g.planned
        stages = sorted({k.split("/", 1)[1] for k in g.by_stage})
        t.add_row(
            str(g.index), g.name, _g(g.capacity_bytes), _g(p.weights), _g(p.kv_cache),
            _g(p.activations), _g(p.runtime), _g(p.total), _g(g.reserved_bytes),
            _g(g.headroom_bytes), ", ".join(stages),
        )  # fmt: skip
    console.print(t)


def _process_table(node: NodePlan, label: str, console: Console) -> None:
    t = Table(
        title=f"Processes of {label} (GiB per GPU; GPUs = CUDA_VISIBLE_DEVICES)",
        title_justify="left",
    )
    for col in ("process", "stages", "GPUs", "weights", "KV", "KV tokens", "activ.", "runtime",
                "total", "alloc. cap"):  # fmt: skip
        if col == "stages":
            t.add_column(col, overflow="fold")
        else:
            t.add_column(col, justify="left" if col == "process" else "right", no_wrap=True)
    many = len(node.replicas) > 4
    for p in node.processes:
        if many and p.replica >= 2:
            continue
        # A cpu process: what its stages hold in host memory instead.
        m = p.memory_per_gpu if p.gpus else budget_rows(s.memory for s in p.stages)
        tokens = sum(s.kv_tokens for s in p.stages)
        t.add_row(
            p.name, "+".join(f"{s.stage} {s.dtype}" if s.dtype else s.stage for s in p.stages),
            (p.env.get("CUDA_VISIBLE_DEVICES", "") or "cpu (host)")
            + (f" (tp{p.tp_size})" if p.tp_size > 1 else ""),
            _g(m.weights), _g(m.kv_cache), f"{tokens:,}" if tokens else "", _g(m.activations),
            _g(m.runtime), _g(m.total),
            "" if p.allocator_fraction is None else f"{p.allocator_fraction:.4f}",
        )  # fmt: skip
    if many:
        t.caption = f"replicas 0-1 of {len(node.replicas)} shown; the others are the same"
    console.print(t)


# the arguments every engine shares (planner.engine_plan): left out of the table's last column
_COMMON_ARGS = frozenset({"constrained_json_disable_any_whitespace", "skip_tokenizer_init",
                          "disable_overlap_schedule", "sampling_backend", "random_seed",
                          "log_level", "disable_prefill_cuda_graph"})  # fmt: skip


def _engine_table(node: NodePlan, label: str, console: Console) -> None:
    """Each SGLang engine of replica 0: dtype, attention backend, KV pool and the SGLang
    arguments it starts with (``--json`` has them all)."""
    t = Table(title=f"SGLang engines of {label} (replica 0)", title_justify="left")
    for col in ("stage", "process", "dtype", "attention", "KV tokens", "KV GiB/rank",
                "SGLang arguments"):  # fmt: skip
        overflow = "fold" if col == "SGLang arguments" else "ellipsis"
        t.add_column(col, overflow=overflow, no_wrap=col != "SGLang arguments")  # type: ignore[arg-type]
    for p in node.processes:
        if p.replica:
            continue
        for s in p.stages:
            if s.engine is None:
                continue
            args = " ".join(f"{k}={v}" for k, v in s.engine.sglang.items() if k not in _COMMON_ARGS)
            t.add_row(s.stage, p.name, s.dtype, s.engine.attention_backend, f"{s.kv_tokens:,}",
                      _g(s.engine.kv_bytes), args)  # fmt: skip
    if t.row_count:
        t.caption = "every engine also: " + " ".join(
            f"{k}={v}" for k, v in _common_args(node).items()
        )
        console.print(t)


def _common_args(node: NodePlan) -> dict[str, object]:
    for p in node.processes:
        for s in p.stages:
            if s.engine is not None:
                return {k: v for k, v in s.engine.sglang.items() if k in _COMMON_ARGS}
    return {}


# ---- SVG ------------------------------------------------------------------------------------

_SHADE = {"weights": 0.38, "kv_cache": 0.55, "activations": 0.70, "runtime": 0.84}


def _color(index: int, category: str) -> str:
    hue = (index * 0.61803398875) % 1.0
    r, g, b = colorsys.hls_to_rgb(hue, _SHADE[category], 0.55)
    return f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}"


def _grey(category: str) -> str:
    """The lightness a category gets in every stage's hue, shown without hue in the legend."""
    v = int(_SHADE[category] * 255)
    return f"#{v:02x}{v:02x}{v:02x}"


def plan_svg(plan: LaunchPlan, max_nodes: int = 8) -> str:
    """Each GPU as a bar: planned bytes stacked by stage and category, then reserved, headroom."""
    layouts = distinct_layouts(plan)[:max_nodes]
    stages: list[str] = []
    for node, _ in layouts:
        for g in node.gpus:
            for key in g.by_stage:
                stage = key.split("/", 1)[1]
                if stage not in stages:
                    stages.append(stage)
    bar_w, gap, top, bar_h, left = 46, 18, 60, 420, 70
    columns = sum(max(len(n.gpus), 1) for n, _ in layouts)
    width = max(left + columns * (bar_w + gap) + len(layouts) * 30 + 260, 700)
    height = top + bar_h + 90
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f"<title>omni-plan: {html.escape(plan.spec)}</title>",
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{left}" y="22" font-size="15" font-weight="bold">{html.escape(plan.spec)}: '
        f"{'fits' if plan.fits else 'does not fit'}, {plan.replicas} replica(s)</text>",
        f'<text x="{left}" y="40" fill="#555">GPU memory by stage and category '
        "(darkest: weights, then KV cache, activations, runtime; grey: reserved)</text>",
    ]
    cap = max((g.capacity_bytes for n, _ in layouts for g in n.gpus), default=1)
    x = left
    for node, names in layouts:
        label = node.node if len(names) == 1 else f"{node.node} (+{len(names) - 1})"
        out.append(f'<text x="{x}" y="{top + bar_h + 58}" font-weight="bold">'
                   f"{html.escape(label)}</text>")  # fmt: skip
        for g in node.gpus:
            scale = bar_h / cap
            y0 = top + bar_h
            h_cap = g.capacity_bytes * scale
            out.append(f'<rect x="{x}" y="{y0 - h_cap:.2f}" width="{bar_w}" height="{h_cap:.2f}" '
                       'fill="none" stroke="#333"/>')  # fmt: skip
            y = y0
            for key, budget in sorted(
                g.by_stage.items(), key=lambda kv: _stage_order(kv[0], stages)
            ):
                stage = key.split("/", 1)[1]
                for cat in CATEGORIES:
                    v = getattr(budget, cat)
                    if v <= 0:
                        continue
                    h = v * scale
                    y -= h
                    out.append(
                        f'<rect x="{x}" y="{y:.2f}" width="{bar_w}" height="{h:.2f}" '
                        f'fill="{_color(stages.index(stage), cat)}" stroke="white" '
                        f'stroke-width="0.3"><title>{html.escape(key)} {cat}: {v:,} B '
                        f"({gib(v)})</title></rect>"
                    )
            h = g.reserved_bytes * scale
            out.append(
                f'<rect x="{x}" y="{y0 - h_cap:.2f}" width="{bar_w}" height="{h:.2f}" '
                f'fill="#bbb"><title>reserved: {g.reserved_bytes:,} B</title></rect>'
            )
            out.append(f'<text x="{x + bar_w / 2}" y="{y0 + 14}" text-anchor="middle">'
                       f"GPU {g.index}</text>")  # fmt: skip
            out.append(
                f'<text x="{x + bar_w / 2}" y="{y0 + 27}" text-anchor="middle" fill="#555" '
                f'font-size="9">{html.escape(g.name)}</text>'
            )
            out.append(
                f'<text x="{x + bar_w / 2}" y="{y0 - h_cap - 4:.2f}" text-anchor="middle" '
                f'font-size="9">{g.planned.total / 2**30:.1f}/'
                f"{g.capacity_bytes / 2**30:.0f}G</text>"
            )
            x += bar_w + gap
        x += 30
    lx, ly = x + 10, top
    for i, stage in enumerate(stages):
        out.append(f'<rect x="{lx}" y="{ly + i * 18}" width="12" height="12" '
                   f'fill="{_color(i, "weights")}"/>')  # fmt: skip
        out.append(f'<text x="{lx + 18}" y="{ly + i * 18 + 10}">{html.escape(stage)}</text>')
    ly += len(stages) * 18 + 12
    swatches = [(cat, _grey(cat)) for cat in CATEGORIES] + [("reserved", "#bbb"), ("free", "white")]
    for j, (name, fill) in enumerate(swatches):
        out.append(f'<rect x="{lx}" y="{ly + j * 18}" width="12" height="12" fill="{fill}" '
                   'stroke="#333" stroke-width="0.5"/>')  # fmt: skip
        out.append(f'<text x="{lx + 18}" y="{ly + j * 18 + 10}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _stage_order(key: str, stages: list[str]) -> tuple[int, int]:
    replica, _, stage = key.partition("/")
    return (int(replica) if replica.isdigit() else 0, stages.index(stage))


def budget_rows(budgets: Iterable[MemoryBudget]) -> MemoryBudget:
    total = MemoryBudget()
    for b in budgets:
        total = MemoryBudget(**{c: getattr(total, c) + getattr(b, c) for c in CATEGORIES})
    return total
