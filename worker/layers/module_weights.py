"""Loading published Qwen3-TTS / Qwen3-ASR safetensors into omni-fleet's own module trees.

The modules carry the checkpoint's tensor names, so loading is a strict name-for-name copy:
a tensor the module lacks, or a module tensor the checkpoint lacks, is a clear start-up error
(never a silently random weight). ``component`` restricts the read to the tensors that
``planner.components.owns`` gives a stage; only the shards holding them are opened.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from worker.layers.stage_weights import CheckpointError, seeded_normal, weight_map


def load_into(
    module: torch.nn.Module,
    model_dir: Path,
    *,
    prefix: str = "",
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    component: Any = None,
    keep_dtype: tuple[str, ...] = (),
    rename: Any = None,
) -> int:
    """Copy the checkpoint's tensors named ``prefix + <module name>`` into ``module``;
    returns the number of elements read. Modules built on the meta device get real tensors
    (``assign``); float tensors are cast to ``dtype`` unless their name ends with one of
    ``keep_dtype``. ``rename`` maps a checkpoint name (without ``prefix``) to the module's
    name where a library renamed a module since the checkpoint was written."""
    from safetensors import safe_open

    from planner.components import owns

    wanted = dict(module.state_dict(keep_vars=True))
    names = weight_map(model_dir)
    by_file: dict[str, list[str]] = defaultdict(list)
    for full, file in names.items():
        if not full.startswith(prefix):
            continue
        if component is not None and not owns(component, full):
            continue
        by_file[file].append(full)
    found: dict[str, torch.Tensor] = {}
    for file, keys in sorted(by_file.items()):
        with safe_open(str(model_dir / file), framework="pt", device="cpu") as f:
            for full in keys:
                local = full[len(prefix) :]
                found[rename(local) if rename else local] = f.get_tensor(full)
    missing = sorted(set(wanted) - set(found))
    unexpected = sorted(set(found) - set(wanted))
    if missing or unexpected:
        raise CheckpointError(
            f"{model_dir}: checkpoint does not match the model ({len(missing)} missing, e.g. "
            f"{missing[:3]}; {len(unexpected)} unexpected, e.g. {unexpected[:3]})"
        )
    state = {}
    elements = 0
    for name, t in found.items():
        ref = wanted[name]
        if tuple(t.shape) != tuple(ref.shape):
            raise CheckpointError(f"{model_dir}: {prefix}{name} has shape {tuple(t.shape)}, "
                                  f"the model expects {tuple(ref.shape)}")  # fmt: skip
        if dtype is not None and t.is_floating_point() and not name.endswith(keep_dtype):
            t = t.to(dtype)
        state[name] = t.to(device)
        elements += t.numel()
    module.load_state_dict(state, strict=True, assign=True)
    return elements


def random_into(
    module: torch.nn.Module,
    *,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    keep_dtype: tuple[str, ...] = (),
    seed: int = 0,
) -> int:
    """``module``'s parameters and persistent buffers at full size, seeded random (normal,
    std 0.02, the same on every device; integer buffers zero) on ``device``: for measuring
    memory and speed of real-size stages without a checkpoint (bench/gpu_check.py), against the
    CPU's results. Returns elements."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, ref in module.state_dict(keep_vars=True).items():
        floating = ref.is_floating_point()
        want = dtype if floating and dtype is not None and not name.endswith(keep_dtype) else None
        if floating:  # (drawn on the CPU: the same weights on every device)
            t = seeded_normal(ref.shape, gen).to(device=device, dtype=want or ref.dtype)
        else:
            t = torch.zeros(ref.shape, dtype=ref.dtype, device=device)
        state[name] = t
    module.load_state_dict(state, strict=True, assign=True)
    return sum(t.numel() for t in state.values())


def load_stage_weights(module: torch.nn.Module, ctx: Any, model_dir: Path, **kw: Any) -> int:
    """``load_into`` for a stage, or ``random_into`` when the stage was asked for random
    weights (``ctx.extra["random_weights"]``); records what it holds in ``ctx.extra["loaded"]``
    (read by bench/gpu_check.py)."""
    from worker.layers.stage_weights import LoadReport

    device = kw.pop("device", ctx.device)
    if ctx.extra.get("random_weights"):
        kw = {k: v for k, v in kw.items() if k in ("dtype", "keep_dtype")}
        elements = random_into(module, device=device, **kw)
    else:
        elements = load_into(module, model_dir, device=device, **kw)
    ctx.extra["loaded"] = LoadReport(tensors=len(module.state_dict()), elements=elements, files=())
    return elements
