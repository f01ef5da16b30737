"""Loading a model spec (or a bare model directory) with its overrides applied."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.errors import SpecError
from planner.overrides import Origin, Override, Provenance, apply, parse_cli, parse_file
from planner.spec import Device, DType, ModelSpec
from planner.yamlio import load_yaml

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8"}
BARE_STAGE = "llm"


@dataclass(frozen=True)
class LoadedSpec:
    spec: ModelSpec
    spec_path: Path
    provenance: Provenance


# A bare directory's KV pool: as many tokens as this many requests of BARE_REQUEST_TOKENS hold
# (the spec's defaults: 16 running requests of 4,096), and at least one whole context
BARE_POOL_REQUESTS = 16
BARE_REQUEST_TOKENS = 4096


def bare_model_spec(model_dir: Path) -> dict[str, Any]:
    """A bare checkpoint directory as a spec: one autoregressive stage holding the whole model.
    With no spec to ask for less, its context is the checkpoint's own (the positions it was
    trained for, as SGLang's default), and its KV pool a fixed number of tokens (requests
    longer than the pool's share queue), so that a long-context checkpoint plans as a short one."""
    from planner.weights import decoder_shape

    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"{model_dir}: cannot read config.json ({exc})") from None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    dtype = config.get("torch_dtype") or config.get("dtype") or text.get("dtype") or "bfloat16"
    context = decoder_shape(model_dir / "config.json").max_positions or BARE_REQUEST_TOKENS
    pool = max(context, BARE_POOL_REQUESTS * min(context, BARE_REQUEST_TOKENS))
    return {
        "name": model_dir.name,
        "description": f"bare model directory {model_dir} planned as one autoregressive stage",
        "model_dir": str(model_dir),
        "capabilities": {"endpoints": ["chat"]},
        "entry": BARE_STAGE,
        "stages": {
            BARE_STAGE: {
                "executor": "autoregressive",
                "terminal": True,
                "component": {"module": ""},
                "dtype": _DTYPES.get(str(dtype), "bf16"),
                "engine": {"context_length": context, "kv_budget_tokens": pool},
            }
        },
    }


def _format_validation(exc: ValidationError, prov: Provenance, where: Path) -> str:
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"])
        origin = prov.entries.get(path)
        source = f" (from {origin.origin.describe()})" if origin else ""
        lines.append(f"  {path or '<spec>'}: {err['msg']}{source}")
    return f"{where}: invalid spec:\n" + "\n".join(lines)


def load_spec(
    spec_path: Path | str,
    overrides: Sequence[str] = (),
    override_file: Path | str | None = None,
    model_dir: Path | None = None,
    node: NodeKind | None = None,
) -> LoadedSpec:
    """``model_dir`` (resolved by :mod:`planner.model_dir`) replaces the spec's own: the same
    stage graph on a downloaded checkpoint. ``node``: the kind of node the spec is planned on,
    which resolves every ``auto`` device and dtype (None: they stay ``auto``)."""
    path = Path(spec_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecError(
                f"{path}: a directory must hold a config.json (a bare model checkpoint)"
            )
        path = path.resolve()
        raw, base, where = bare_model_spec(path), "model-dir", str(path / "config.json")
    elif path.is_file():
        raw, base, where = load_yaml(path), "spec", str(path)
        if not isinstance(raw, dict):
            raise SpecError(f"{path}: a model spec is a YAML mapping")
    else:
        raise SpecError(f"{path}: no such spec file or model directory")
    ovs: list[Override] = []
    if override_file is not None:
        ovs += parse_file(Path(override_file))
    ovs += parse_cli(list(overrides))
    if model_dir is not None:
        raw = {**raw, "model_dir": str(model_dir)}
    resolved, prov = apply(raw, base, where, ovs)  # type: ignore[arg-type]
    if node is not None:
        _resolve_auto(resolved, prov, node)
    _cpu_stages_run_fp32(resolved, prov)
    try:
        spec = ModelSpec.model_validate(resolved)
    except ValidationError as exc:
        raise SpecError(_format_validation(exc, prov, path)) from None
    except ValueError as exc:  # the graph validator
        raise SpecError(f"{path}: {exc}") from None
    _check_stage_settings(spec, path)
    return LoadedSpec(spec=spec, spec_path=path, provenance=prov)


@dataclass(frozen=True)
class NodeKind:
    """What ``auto`` resolves by: whether the node has GPUs, and how it was named."""

    gpus: bool
    label: str  # e.g. "a node with GPUs (1xH100-80GB)"


def _resolve_auto(resolved: dict, prov: Provenance, node: NodeKind) -> None:
    """``device: auto``: a GPU where the node has GPUs, else the CPU (pins dropped there);
    ``dtype: auto``: bf16 on a GPU, fp32 on the CPU. Recorded as resolved for the node, so
    that ``omni-plan explain`` shows where the value came from."""
    stages = resolved.get("stages")
    if not isinstance(stages, dict):
        return

    def put(name: str, stage: dict, field: str, value: Any) -> None:
        stage[field] = value
        entry = prov.entries.get(f"stages.{name}.{field}")
        if entry is not None:
            entry.overrode.insert(0, entry.origin)
            entry.value, entry.origin = value, Origin("node", node.label, value)

    for name, stage in stages.items():
        if not isinstance(stage, dict):
            continue
        if stage.get("device") == Device.AUTO:
            put(name, stage, "device", Device.GPU.value if node.gpus else Device.CPU.value)
            if not node.gpus and stage.get("gpus") is not None:
                put(name, stage, "gpus", None)
        if stage.get("dtype") == DType.AUTO:
            put(name, stage, "dtype", DType.AUTO.on(stage.get("device", Device.GPU)).value)


def _cpu_stages_run_fp32(resolved: dict, prov: Provenance) -> None:
    """A stage on the CPU whose dtype nobody set (not the spec, not an override) runs float32,
    not the GPU default bf16: bf16 on a CPU is slow and its results diverge from the
    references' (Omni's text, codec codes and the ASR text all differed). ``--gpus cpu`` moves
    stages with an fp32 override (planner.api.cpu_overrides)."""
    stages = resolved.get("stages")
    if not isinstance(stages, dict):
        return
    for name, stage in stages.items():
        if isinstance(stage, dict) and stage.get("device") == "cpu" and "dtype" not in stage:
            stage["dtype"] = "fp32"
            entry = prov.entries.get(f"stages.{name}.dtype")
            if entry is not None:
                entry.value = "fp32"
                entry.origin = Origin("default", "a cpu stage", "fp32")


def _check_stage_settings(spec: ModelSpec, path: Path) -> None:
    """Rules that involve more than one field: precise errors before any planning."""
    for name, stage in spec.stages.items():
        where = f"{path}: stages.{name}"
        if (
            stage.executor.value in ("autoregressive", "encoder", "vocoder")
            and stage.component is None
        ):
            raise SpecError(
                f"{where}: a {stage.executor.value} stage needs a component (its weights)"
            )
        cpu = stage.device == Device.CPU
        # (on GPUs a stage's tp_size is its process's: its GPUs)
        if cpu and stage.tp_size != 1 and stage.executor.value != "autoregressive":
            raise SpecError(
                f"{where}: tp_size {stage.tp_size} on a cpu {stage.executor.value} stage; "
                "tensor parallelism is SGLang's, under autoregressive stages: use 1"
            )
        if cpu and stage.gpus:
            raise SpecError(f"{where}: gpus {stage.gpus} pinned on a cpu stage")
        if stage.gpus is not None:
            if len(stage.gpus) != stage.tp_size:
                raise SpecError(
                    f"{where}: pins {len(stage.gpus)} GPUs {stage.gpus} but tp_size is "
                    f"{stage.tp_size}; pin one GPU per tensor-parallel rank"
                )
            if len(set(stage.gpus)) != len(stage.gpus) or min(stage.gpus) < 0:
                raise SpecError(f"{where}: gpus {stage.gpus} must be distinct indices >= 0")
        if stage.engine.context_length < stage.engine.max_new_tokens:
            raise SpecError(
                f"{where}.engine: max_new_tokens {stage.engine.max_new_tokens} exceeds "
                f"context_length {stage.engine.context_length}"
            )
    # (an unresolved auto stage is checked as the GPU stage it may become)
    gpu_stages = {n: s for n, s in spec.stages.items() if s.device != Device.CPU}
    unpinned = [n for n, s in gpu_stages.items() if s.gpus is None]
    if unpinned and len(unpinned) < len(gpu_stages):
        raise SpecError(
            f"{path}: some GPU stages pin gpus and {', '.join(unpinned)} do not; pin every GPU "
            "stage (a fixed layout) or none (automatic placement)"
        )
    for group, names in spec.process_groups().items():
        gpu = [spec.stages[n] for n in names if spec.stages[n].device != Device.CPU]
        if len({s.tp_size for s in gpu}) > 1:
            sizes = {
                n: spec.stages[n].tp_size for n in names if spec.stages[n].device != Device.CPU
            }
            raise SpecError(
                f"{path}: process {group!r} mixes tp_size {sizes}; GPU stages sharing a process "
                "share its GPUs, so set the same tp_size on all of them"
            )
        if len({tuple(s.gpus) if s.gpus is not None else None for s in gpu}) > 1:
            raise SpecError(
                f"{path}: process {group!r} pins its stages to different GPUs; stages sharing a "
                "process share its GPUs"
            )
