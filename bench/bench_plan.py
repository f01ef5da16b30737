"""Planning benchmark: a 64-node x 8-GPU fleet, cold (meta builds) vs warm (cached) plans.

    python bench/bench_plan.py [--repeats 5] [--nodes 64] [--gpus-per-node 8]

Cold = the planner's in-memory caches emptied and no disk cache (every component is rebuilt on
the meta device and counted); disk = in-memory caches emptied, counts read from the disk cache
(what a fresh ``omni-plan`` process does); warm = the same plan again with everything cached.
torch/transformers are imported once before timing (a fresh process pays that once, ~5 s, but
not at all when the disk cache answers). Prints medians; run by hand.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.api import plan_spec  # noqa: E402
from planner.catalog import load_catalog  # noqa: E402
from planner.inventory import Inventory, Node  # noqa: E402
from planner.weights import clear_cache  # noqa: E402

SPECS = [
    "qwen3-omni-30b-a3b-speech.yaml",
    "qwen3-omni-30b-a3b-speech-colocated.yaml",
    "qwen3-tts-12hz-1.7b.yaml",
    "qwen3-8b.yaml",
]


def fleet(nodes: int, per_node: int, mixed: bool) -> Inventory:
    cat = load_catalog()
    kinds = [cat.get("H100-80GB"), cat.get("H200-141GB")] if mixed else [cat.get("H100-80GB")]
    return Inventory(
        nodes=tuple(
            Node(name=f"node-{i:03d}", gpus=(kinds[i % len(kinds)],) * per_node)
            for i in range(nodes)
        ),
        catalog=cat,
    )


def timed(fn, repeats: int, before=None) -> list[float]:
    out = []
    for _ in range(repeats):
        if before:
            before()
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ns = ap.parse_args()
    import torch  # noqa: F401  (import cost is paid once per process, not per plan)
    import transformers  # noqa: F401

    print(f"{ns.nodes} nodes x {ns.gpus_per_node} GPUs, {ns.repeats} repeats, medians")
    head = ("spec", "inventory", "replicas", "cold s", "disk s", "warm s", "JSON MB")
    disk_dir = tempfile.mkdtemp(prefix="omni-plan-bench-")
    print(f"{head[0]:44} {head[1]:10} " + " ".join(f"{h:>8}" for h in head[2:]))
    for mixed in (False, True):
        inv = fleet(ns.nodes, ns.gpus_per_node, mixed)
        for name in SPECS:
            spec = ROOT / "configs" / "models" / name
            result = plan_spec(spec, inv)  # also imports the model classes once
            run = lambda spec=spec, inv=inv: plan_spec(spec, inv)  # noqa: E731
            os.environ["OMNI_PLAN_CACHE"] = "off"
            cold = timed(run, ns.repeats, clear_cache)
            os.environ["OMNI_PLAN_CACHE"] = disk_dir
            run()  # fills the disk cache
            disk = timed(run, ns.repeats, clear_cache)
            warm = timed(run, ns.repeats)
            size = len(result.plan.model_dump_json()) / 1e6
            label = "H100+H200" if mixed else "8xH100"
            print(
                f"{name:44} {label:10} {result.plan.replicas:8d} "
                f"{statistics.median(cold):8.3f} {statistics.median(disk):8.3f} "
                f"{statistics.median(warm):8.3f} {size:8.2f}"
            )


if __name__ == "__main__":
    main()
