"""A stage's module with exactly its own weights, read straight from the checkpoint's shards.

The model's module tree is built from its config with every parameter on PyTorch's ``meta``
device (buffers such as rotary frequencies are computed for real: they are small and not in
checkpoints). The stage's submodule is cut out, the sub-modules other stages hold (``exclude``)
are dropped, and only the tensors that :func:`planner.components.owns_tensor` assigns to the
stage are read from the safetensors shards named by the index's weight map. No process ever
materialises weights of another stage, and the element count it loads equals what
``omni-plan`` counted for it (both use the same definition).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.components import owns
from planner.spec import ComponentSpec

INDEX_FILE = "model.safetensors.index.json"
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def torch_dtype(name: str) -> Any:
    """The torch dtype of a spec's ``dtype`` (bf16, fp16, fp32); a clear error for others."""
    import torch

    if str(name) not in TORCH_DTYPES:
        raise ValueError(f"dtype {name!r} is not one of {sorted(TORCH_DTYPES)}")
    return getattr(torch, TORCH_DTYPES[str(name)])


class CheckpointError(ValueError):
    """The checkpoint directory lacks what the stage needs (a clear start-up failure)."""


@dataclass(frozen=True)
class LoadReport:
    tensors: int
    elements: int  # parameters + persistent buffers read from the checkpoint
    files: tuple[str, ...]  # shard files opened


def weight_map(model_dir: Path) -> dict[str, str]:
    """Tensor name -> shard file name: the index's weight map, else the keys of the single
    ``*.safetensors`` files in the directory."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    from safetensors import safe_open

    names: dict[str, str] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            names.update({k: path.name for k in f.keys()})  # noqa: SIM118 - not a dict
    if not names:
        raise CheckpointError(f"{model_dir}: no {INDEX_FILE} and no *.safetensors files")
    return names


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Construct modules with parameters on the meta device and buffers for real (what
    accelerate calls ``init_empty_weights(include_buffers=False)``): initialisers then run on
    meta tensors and cost nothing, whatever the model's size."""
    import torch

    register = torch.nn.Module.register_parameter

    def register_on_meta(
        self: torch.nn.Module, name: str, param: torch.nn.Parameter | None
    ) -> None:
        register(self, name, param)
        registered = self._parameters[name]
        if param is not None and registered is not None and param.device.type != "meta":
            kind = type(registered)
            self._parameters[name] = kind(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def _skeleton(config_dir: Path, dtype: Any) -> Any:
    """The whole model from its config, every parameter on the meta device."""
    raw = json.loads((config_dir / "config.json").read_text())
    cls = model_class(raw, config_dir)
    config = cls.config_class.from_pretrained(config_dir)
    with parameters_on_meta():
        return cls._from_config(config, dtype=dtype)


def _cut(whole: Any, component: ComponentSpec) -> Any:
    """The component's module without the sub-modules other stages hold."""
    module = whole.get_submodule(component.module) if component.module else whole
    for name in component.exclude:
        parent, _, leaf = name.rpartition(".")
        delattr(module.get_submodule(parent) if parent else module, leaf)
    return module


def model_class(config: dict[str, Any], where: Path) -> Any:
    import transformers

    archs = config.get("architectures") or []
    cls = getattr(transformers, archs[0], None) if archs else None
    if cls is None:
        raise CheckpointError(f"{where}/config.json: no transformers class in {archs}")
    return cls


def load_stage_module(
    model_dir: Path, component: ComponentSpec, dtype: str, device: str
) -> tuple[Any, LoadReport]:
    """The component's module (eval mode, on ``device``) and what was read to build it.

    Checkpoints keep their published layout (Qwen3-Omni's per-expert MoE weights, its
    ``thinker.audio_tower`` names); transformers' own conversion mapping renames and fuses them
    into its modules, and tells which checkpoint tensors feed which module tensor."""
    from safetensors import safe_open
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import (
        WeightConverter,
        WeightRenaming,
        convert_and_load_state_dict_in_model,
        rename_source_key,
    )
    from transformers.modeling_utils import LoadStateDictConfig

    config_dir = model_dir / component.config_dir if component.config_dir else model_dir
    dtype_of = torch_dtype(dtype)
    whole = _skeleton(config_dir, dtype_of)
    mapping = get_model_conversion_mapping(whole)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    meta_state = whole.state_dict()
    prefix = whole.base_model_prefix
    stored = weight_map(config_dir)
    mine: dict[str, str] = {}  # checkpoint name -> shard file
    for name, file in stored.items():
        target, _ = rename_source_key(name, renamings, converters, prefix, meta_state)
        if target in meta_state and owns(component, target):
            mine[name] = file
    handles = {
        f: safe_open(str(config_dir / f), framework="pt", device="cpu") for f in set(mine.values())
    }
    state = {name: handles[file].get_slice(name) for name, file in mine.items()}
    elements = sum(math.prod(s.get_shape()) for s in state.values())
    load_config = LoadStateDictConfig(
        dtype=dtype_of,
        # transformers annotates weight_mapping narrower than get_model_conversion_mapping's
        # list[WeightTransform], which its own from_pretrained passes here as well
        weight_mapping=mapping,  # type: ignore[arg-type]
        device_map={"": device},
    )
    convert_and_load_state_dict_in_model(model=whole, state_dict=state, load_config=load_config)
    module = _cut(whole, component)
    still_meta = [n for n, p in module.named_parameters() if p.device.type == "meta"]
    if still_meta:
        raise CheckpointError(
            f"{config_dir}: the checkpoint lacks {len(still_meta)} tensors of "
            f"{component.module or 'the model'} (first: {still_meta[0]})"
        )
    module.to(device)
    report = LoadReport(tensors=len(state), elements=elements, files=tuple(sorted(handles)))
    return module.eval(), report


def seeded_normal(shape: Any, gen: Any) -> Any:
    """A tensor of normal draws (std 0.02) in fp32 on the CPU, from ``gen``: random weights that
    do not depend on the device they are used on."""
    import torch

    return torch.empty(shape, dtype=torch.float32).normal_(0.0, 0.02, generator=gen)


def random_stage_module(
    model_dir: Path, component: ComponentSpec, dtype: str, device: str, seed: int = 0
) -> tuple[Any, LoadReport]:
    """The component's module at full size with seeded random weights and no checkpoint: for
    measuring memory and speed of real-size stages (bench/gpu_check.py). The same seed gives the
    same weights on every device (drawn on the CPU, then moved), so that a GPU's results can be
    held against the CPU's; the rest of the model is never materialised."""
    import torch

    config_dir = model_dir / component.config_dir if component.config_dir else model_dir
    dtype_of = torch_dtype(dtype)
    whole = _skeleton(config_dir, dtype_of)
    module = _cut(whole, component)
    gen = torch.Generator().manual_seed(seed)
    elements = 0
    replaced: dict[int, Any] = {}
    for sub in module.modules():
        for key, p in list(sub._parameters.items()):
            if p is None:
                continue
            if id(p) not in replaced:
                data = seeded_normal(p.shape, gen).to(device=device, dtype=dtype_of)
                replaced[id(p)] = torch.nn.Parameter(data, requires_grad=False)
                elements += p.numel()
            sub._parameters[key] = replaced[id(p)]
    module.to(device)
    return module.eval(), LoadReport(tensors=len(replaced), elements=elements, files=())
