"""What every Qwen3-Omni stage shares: its config and its own weights."""

from __future__ import annotations

from typing import Any

from worker.contract.stage_context import StageContext


def load(ctx: StageContext) -> tuple[Any, Any]:
    """(the model's whole config, this stage's module with only its own weights)."""
    from transformers import Qwen3OmniMoeConfig

    from worker.layers.stage_weights import load_stage_module, random_stage_module

    if ctx.stage.component is None:
        raise ValueError(f"stage {ctx.name} needs a component")
    if ctx.stage.tp_size > 1:
        raise ValueError(f"stage {ctx.name}: tp_size {ctx.stage.tp_size} is not supported yet")
    # bench/gpu_check.py measures real-size stages without a 70 GB download
    build = random_stage_module if ctx.extra.get("random_weights") else load_stage_module
    module, report = build(ctx.checkpoint, ctx.stage.component, ctx.dtype, ctx.device)
    ctx.extra["loaded"] = report
    return Qwen3OmniMoeConfig.from_pretrained(ctx.checkpoint), module


def on_device(x: Any, device: Any, dtype: Any = None) -> Any:
    """An input array as a tensor on ``device`` (in ``dtype``): a tensor that a stage of this
    process handed over is used as it is (no copy when device and dtype match already), a
    numpy array from another process is copied in."""
    import torch

    t = torch.as_tensor(x)
    return t.to(device=device, dtype=dtype) if dtype is not None else t.to(device)
