"""One override language, two spellings, and where every resolved value came from.

* YAML (``--override-file``): ``stages.<stage>.<field>`` as nested mappings or dotted keys,
  e.g. ``stages: {thinker: {engine: {max_running_requests: 8}}}`` or
  ``stages.thinker.engine.max_running_requests: 8``.
* CLI: ``--<stage>.<field> VALUE`` or ``--<stage>.<field>=VALUE``, e.g.
  ``--thinker.engine.max_running_requests 8``.

Precedence: the spec (or the schema default) < the override file < the CLI. Within one level a
path may be given once (repeating the same value is harmless; two different values are an
error). Overrides change settings, never the graph: see :data:`GRAPH_FIELDS`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel

from planner.errors import OverrideError, unknown
from planner.spec import StageSpec
from planner.yamlio import load_yaml, parse_scalar

# Fields that define the graph or what a stage runs: fixed by the spec.
GRAPH_FIELDS = frozenset(
    {"executor", "component", "process", "next", "stream_to", "wait_for", "terminal",
     "only_for_output"}
)  # fmt: skip

# "node": an ``auto`` device or dtype resolved for the node planned on (planner.loader)
Source = Literal["default", "spec", "model-dir", "file", "cli", "node"]
LEVELS: tuple[Source, ...] = ("default", "spec", "model-dir", "file", "cli", "node")


@dataclass(frozen=True)
class Origin:
    source: Source
    where: str  # a file path, or the CLI spelling
    value: Any

    def describe(self) -> str:
        if self.source == "default":
            return f"schema default for {self.where}" if self.where else "schema default"
        if self.source == "cli":
            return f"command line {self.where}"
        if self.source == "file":
            return f"override file {self.where}"
        if self.source == "model-dir":
            return f"derived from {self.where}"
        if self.source == "node":
            return f"auto, resolved for {self.where}"
        return f"spec {self.where}"


@dataclass
class Resolved:
    path: str
    value: Any
    origin: Origin
    overrode: list[Origin] = field(default_factory=list)  # what it replaced, newest first


@dataclass
class Provenance:
    entries: dict[str, Resolved] = field(default_factory=dict)

    def get(self, path: str) -> Resolved:
        key = normalize_path(path)
        if key in self.entries:
            return self.entries[key]
        parts = key.split(".")
        if parts[0] == "stages" and len(parts) > 1:
            stages = {p.split(".")[1] for p in self.entries if p.startswith("stages.")}
            if parts[1] not in stages:
                raise OverrideError(unknown("stage", parts[1], stages))
            prefix = ".".join(parts[:-1]) + "."
            names = {p[len(prefix) :].split(".")[0] for p in self.entries if p.startswith(prefix)}
            if names:
                raise OverrideError(unknown("field", parts[-1], names, ".".join(parts[:-1])))
        raise OverrideError(unknown("path", key, self.entries))

    def explain(self, path: str) -> str:
        r = self.get(path)
        lines = [f"{r.path} = {_show(r.value)}", f"  set by   {r.origin.describe()}"]
        lines += [f"  overrode {_show(o.value)} from {o.describe()}" for o in r.overrode]
        if not r.overrode:
            lines.append("  (nothing overridden)")
        return "\n".join(lines)


def _show(value: Any) -> str:
    return "null" if value is None else repr(value) if isinstance(value, str) else str(value)


@dataclass(frozen=True)
class Override:
    path: str  # normalized: stages.<stage>.<field>...
    value: Any
    source: Source
    where: str


TOP_LEVEL = ("name", "description", "model_dir", "entry", "served_models")


def normalize_path(path: str) -> str:
    """``thinker.tp_size`` (CLI spelling) and ``stages.thinker.tp_size`` are one path."""
    path = path.strip().lstrip("-")
    return path if path.startswith("stages.") or path in TOP_LEVEL else f"stages.{path}"


def parse_cli(args: list[str] | tuple[str, ...]) -> list[Override]:
    """``--stage.field VALUE`` / ``--stage.field=VALUE`` / ``stage.field=VALUE`` tokens."""
    out: list[Override] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("--"):
            name, eq, value = token[2:].partition("=")
            if not eq:
                if i + 1 >= len(args) or _is_option(args[i + 1]):
                    raise OverrideError(f"{token}: missing value (use {token} VALUE)")
                value = args[i + 1]
                i += 1
            spelling = f"--{name} {value}"
        elif "=" in token:
            name, _, value = token.partition("=")
            spelling = token
        else:
            raise OverrideError(
                f"cannot read override {token!r}: use --<stage>.<field> VALUE, "
                "e.g. --thinker.engine.max_running_requests 8"
            )
        if "." not in name:
            raise OverrideError(
                f"--{name}: not an override path; use --<stage>.<field> VALUE, "
                "e.g. --thinker.engine.max_running_requests 8"
            )
        out.append(Override(normalize_path(name), parse_scalar(value), "cli", spelling))
        i += 1
    return out


def _is_option(token: str) -> bool:
    return token.startswith("--") and len(token) > 2 and not token[2].isdigit()


def parse_file(path: Path) -> list[Override]:
    raw = load_yaml(path)
    if raw is None:
        return []
    if not isinstance(raw, dict):
        raise OverrideError(f"{path}: an override file is a mapping of stages.<stage>.<field>")
    flat: dict[str, Any] = {}
    _flatten(raw, "", flat, path)
    out = []
    for key, value in flat.items():
        if not key.startswith("stages."):
            raise OverrideError(
                f"{path}: {key!r} is not an override path; paths start with stages.<stage>."
            )
        out.append(Override(key, value, "file", str(path)))
    return out


def _flatten(node: dict, prefix: str, out: dict[str, Any], path: Path) -> None:
    for key, value in node.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            _flatten(value, dotted + ".", out, path)
        else:
            if dotted in out and out[dotted] != value:
                raise OverrideError(
                    f"{path}: {dotted} is given twice with different values "
                    f"({_show(out[dotted])} and {_show(value)}); give it one value"
                )
            out[dotted] = value


def _field_model(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The nested settings model of a field, if the field is one (engine, batching, memory)."""
    annotation = model.model_fields[name].annotation
    candidates = [annotation, *get_args(annotation)] if get_origin(annotation) else [annotation]
    for c in candidates:
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
    return None


def check_path(path: str, stages: list[str]) -> list[str]:
    """Validate ``stages.<stage>.<field>...`` against the schema; returns its parts."""
    parts = path.split(".")
    if len(parts) < 3 or parts[0] != "stages":
        raise OverrideError(
            f"{path}: an override path is stages.<stage>.<field> (CLI: --<stage>.<field>)"
        )
    stage = parts[1]
    if stage not in stages:
        raise OverrideError(unknown("stage", stage, stages))
    model: type[BaseModel] = StageSpec
    where = f"stages.{stage}"
    for i, name in enumerate(parts[2:]):
        if name in GRAPH_FIELDS and model is StageSpec:
            settable = sorted(set(StageSpec.model_fields) - GRAPH_FIELDS)
            raise OverrideError(
                f"{path}: {name!r} is part of the stage graph, fixed by the spec; overrides change "
                f"settings only ({', '.join(settable)})"
            )
        if name not in model.model_fields:
            fields = sorted(
                set(model.model_fields) - (GRAPH_FIELDS if model is StageSpec else set())
            )
            raise OverrideError(unknown("field", name, fields, where))
        nested = _field_model(model, name)
        last = i == len(parts) - 3
        if nested is None and not last:
            raise OverrideError(
                f"{path}: {where}.{name} is a value, it has no field {parts[i + 3]!r}"
            )
        if nested is not None and last:
            raise OverrideError(
                f"{path}: {where}.{name} is a group; set one of its fields: "
                f"{', '.join(sorted(nested.model_fields))}"
            )
        model = nested or model
        where = f"{where}.{name}"
    return parts


def _leaf_paths(model: type[BaseModel], prefix: str) -> list[tuple[str, Any]]:
    """(path, default) of every settable leaf of a settings model."""
    out = []
    for name, info in model.model_fields.items():
        if model is StageSpec and name in GRAPH_FIELDS:
            continue
        nested = _field_model(model, name)
        if nested is not None:
            out += _leaf_paths(nested, f"{prefix}.{name}")
        else:
            default = None if info.is_required() else info.get_default(call_default_factory=True)
            out.append((f"{prefix}.{name}", default))
    return out


def _lookup(raw: dict, parts: list[str]) -> tuple[bool, Any]:
    node: Any = raw
    for p in parts:
        if not isinstance(node, dict) or p not in node:
            return False, None
        node = node[p]
    return True, node


def _assign(raw: dict, parts: list[str], value: Any) -> None:
    node = raw
    for p in parts[:-1]:
        child = node.get(p)
        if not isinstance(child, dict):
            child = {}
            node[p] = child
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def apply(
    raw: dict, base: Source, base_where: str, overrides: list[Override]
) -> tuple[dict, Provenance]:
    """Apply file then CLI overrides to a raw spec mapping; record every value's origin."""
    stages_raw = raw.get("stages")
    stages = list(stages_raw) if isinstance(stages_raw, dict) else []
    result = copy.deepcopy(raw)
    prov = Provenance()
    for key in TOP_LEVEL:
        if key in raw:
            prov.entries[key] = Resolved(key, raw[key], Origin(base, base_where, raw[key]))
    for stage in stages:
        for path, default in _leaf_paths(StageSpec, f"stages.{stage}"):
            found, value = _lookup(raw, path.split("."))
            origin = Origin(base, base_where, value) if found else Origin("default", "", default)
            prov.entries[path] = Resolved(path, value if found else default, origin)

    for level in ("file", "cli"):
        given: dict[str, Override] = {}
        for ov in (o for o in overrides if o.source == level):
            parts = check_path(ov.path, stages)
            prior = given.get(ov.path)
            if prior is not None and prior.value != ov.value:
                raise OverrideError(
                    f"{ov.path} is given twice at one level with different values: "
                    f"{_show(prior.value)} ({prior.where}) and {_show(ov.value)} ({ov.where})"
                )
            given[ov.path] = ov
            _assign(result, parts, ov.value)
            entry = prov.entries[ov.path]
            new = Origin(ov.source, ov.where, ov.value)
            if prior is None:
                entry.overrode.insert(0, entry.origin)
            entry.origin, entry.value = new, ov.value
    return result, prov
