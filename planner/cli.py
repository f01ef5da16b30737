"""``omni-plan``: plan a model spec (or a bare model directory) onto GPUs, before launch.

    omni-plan SPEC_OR_MODEL_DIR [--gpus 2xH100-80GB | --inventory FILE] [--json] [--svg FILE]
              [--override-file FILE] [--max-replicas-per-node N] [--model-dir DIR_OR_REPO]
              [--<stage>.<field> VALUE ...]
    omni-plan explain SPEC PATH [--gpus GPUS | --inventory FILE] [--override-file FILE]
              [--<stage>.<field> VALUE ...]

Exit status: 0 the plan fits; 1 it does not fit (the errors say where and what would fix it);
2 the spec, an override or the inventory is invalid.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from planner.errors import PlannerError

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_INVALID = 0, 1, 2


def _console(stderr: bool = False) -> Console:
    width = max(shutil.get_terminal_size((180, 40)).columns, 100)
    return Console(width=width, stderr=stderr, highlight=False, soft_wrap=False)


_TRUE = frozenset({"1", "true", "yes", "on"})


def _option(parser: argparse._ActionsContainer, flag: str, help: str, **kwargs: Any) -> None:
    """``--flag``, also read from its ``OMNI_`` variable (as the worker's flags are): the same
    variables give ``omni-plan`` the plan that ``omni-worker`` would make on this node."""
    env = "OMNI_" + flag[2:].replace("-", "_").upper()
    value = os.environ.get(env)
    if value:  # argparse converts a string default with the option's ``type``
        kwargs["default"] = value.lower() in _TRUE if kwargs.get("action") else value
    parser.add_argument(flag, help=f"{help} [env: {env}]", **kwargs)


def _plan_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="omni-plan",
        description="Exact VRAM and process placement of a model spec, before launch. "
        "Settings are overridden with --<stage>.<field> VALUE "
        "(e.g. --thinker.engine.max_running_requests 8). "
        "'omni-plan explain SPEC PATH' shows where a value came from.",
    )
    p.add_argument("spec", help="a model spec (configs/models/*.yaml) or a model directory")
    where = p.add_mutually_exclusive_group()
    _option(
        where, "--gpus", "GPUs of one node, e.g. 2xH100-80GB (default: no GPUs)", metavar="GPUS"
    )
    _option(where, "--inventory", "YAML inventory of one or more nodes", type=Path, metavar="PATH")
    _option(
        p, "--override-file", "YAML of stages.<stage>.<field> values", type=Path, metavar="PATH"
    )
    _option(p, "--json", "print the launch plan as JSON", action="store_true")
    _option(
        p, "--svg", "write a picture of each GPU's memory to this file", type=Path, metavar="PATH"
    )
    _option(
        p,
        "--max-replicas-per-node",
        "at most this many pipelines on one node (default: as many as fit)",
        type=int,
        metavar="N",
    )
    _option(
        p,
        "--model-dir",
        "a checkpoint directory or Hugging Face repo id (from the local cache) to plan instead "
        "of the spec's model_dir",
        metavar="DIR",
    )
    return p


def _explain_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="omni-plan explain",
        description="Where a resolved value came from and what it overrode; for "
        "<stage>.sglang, the stage's SGLang engine as the plan starts it (its dtype, attention "
        "backend, KV pool and server arguments). An auto device or dtype is resolved for the "
        "node: --gpus or --inventory (default: no GPUs).",
    )
    p.add_argument("spec", help="a model spec (configs/models/*.yaml) or a model directory")
    p.add_argument("path", help="stages.<stage>.<field>, <stage>.<field> or <stage>.sglang")
    where = p.add_mutually_exclusive_group()
    _option(where, "--gpus", "GPUs of one node, e.g. 2xH100-80GB", metavar="GPUS")
    _option(where, "--inventory", "YAML inventory of one or more nodes", type=Path, metavar="PATH")
    _option(
        p, "--override-file", "YAML of stages.<stage>.<field> values", type=Path, metavar="PATH"
    )
    return p


def _split(argv: list[str], known_flags: set[str]) -> tuple[list[str], list[str]]:
    """Separate the command's own arguments from --<stage>.<field> overrides."""
    own, overrides = [], []
    i = 0
    while i < len(argv):
        token = argv[i]
        name = token.split("=", 1)[0]
        if token.startswith("--") and "." in name and name not in known_flags:
            overrides.append(token)
            if "=" not in token and i + 1 < len(argv):
                overrides.append(argv[i + 1])
                i += 1
        else:
            own.append(token)
        i += 1
    return own, overrides


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] == "explain":
            return _explain(args[1:])
        return _plan(args)
    except PlannerError as exc:
        _console(stderr=True).print(f"[bold red]error:[/bold red] {exc}", highlight=False)
        return EXIT_INVALID


def _explain(argv: list[str]) -> int:
    own, overrides = _split(argv, {"--override-file", "--gpus", "--inventory"})
    ns = _explain_parser().parse_args(own)
    from planner.api import plan_spec

    inventory = ns.inventory if ns.inventory is not None else ns.gpus
    result = plan_spec(ns.spec, inventory, overrides, ns.override_file)
    path = ns.path.removeprefix("stages.")
    stage, _, field = path.partition(".")
    if field == "sglang":
        print(_engine_text(result, stage))
    else:
        print(result.provenance.explain(ns.path))
    return EXIT_FITS


def _engine_text(result: Any, stage: str) -> str:
    """A stage's SGLang engine in the plan (its first replica): dtype, attention backend, KV
    pool and the server arguments, with where its dtype and device came from."""
    from planner.errors import OverrideError, unknown

    placed = [
        (p, s) for n in result.plan.nodes[:1] for p in n.processes if not p.replica
        for s in p.stages if s.stage == stage
    ]  # fmt: skip
    if not placed:
        raise OverrideError(unknown("stage", stage, result.spec.stages))
    process, s = placed[0]
    if s.engine is None:
        return f"stages.{stage} is not an autoregressive stage: it runs no SGLang engine"
    where = f"GPUs {process.gpus}" if process.gpus else "the CPU"
    lines = [
        f"stages.{stage}: SGLang engine in process {process.name} on {where}",
        f"  dtype {s.dtype}: {result.provenance.get(f'stages.{stage}.dtype').origin.describe()}",
        f"  attention backend {s.engine.attention_backend}",
        f"  KV pool {s.kv_tokens:,} tokens, {s.engine.kv_bytes:,} bytes a rank",
        "  SGLang arguments:",
    ]
    lines += [f"    {k} = {v}" for k, v in s.engine.sglang.items()]
    return "\n".join(lines)


def _plan(argv: list[str]) -> int:
    own, overrides = _split(
        argv, {"--gpus", "--inventory", "--override-file", "--svg", "--model-dir"}
    )
    ns = _plan_parser().parse_args(own)
    from planner.api import plan_spec
    from planner.model_dir import resolve_model_dir
    from planner.render import plan_svg, print_plan

    inventory = ns.inventory if ns.inventory is not None else ns.gpus
    result = plan_spec(
        ns.spec,
        inventory,
        overrides,
        ns.override_file,
        max_replicas_per_node=ns.max_replicas_per_node,
        model_dir=resolve_model_dir(ns.model_dir) if ns.model_dir else None,
    )
    plan = result.plan
    if ns.svg is not None:
        ns.svg.write_text(plan_svg(plan))
    if ns.json:
        print(plan.model_dump_json(indent=2))
    else:
        label = str(ns.inventory) if ns.inventory else (ns.gpus or "this host, no GPUs")
        print_plan(plan, _console(), label)
        if ns.svg is not None:
            print(f"wrote {ns.svg}")
    if not plan.fits and ns.json:
        err = _console(stderr=True)
        for e in plan.errors:
            err.print(f"[bold red]error:[/bold red] {e.message}", highlight=False)
    return EXIT_FITS if plan.fits else EXIT_DOES_NOT_FIT


if __name__ == "__main__":
    raise SystemExit(main())
