"""What a stage process knows of the stage it runs: the spec, the checkpoint, the device and the
plan's share of it. The runtime builds it; stage executors and the engines under them read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.spec import ModelSpec, StageSpec


@dataclass(slots=True)
class StageContext:
    name: str
    spec: ModelSpec
    stage: StageSpec
    checkpoint: Path  # where components and the tokenizer are loaded from
    device: str  # torch device string: "cpu", "cuda:0"
    max_running_requests: int  # from the plan (falls back to the spec's engine settings)
    kv_tokens: int = 0  # the plan's KV capacity in tokens for this stage; 0 = unlimited
    memory_fraction: float | None = None  # the plan's share of the process's GPU (None: CPU)
    extra: dict[str, Any] = field(default_factory=dict)

    def component_dir(self, stage: str | None = None) -> Path:
        comp = self.spec.stages[stage or self.name].component
        sub = comp.config_dir if comp else ""
        return self.checkpoint / sub if sub else self.checkpoint
