"""What a stage process knows of the stage it runs: the spec, the checkpoint, the device and what
the plan gives it there. The runtime builds it; stage executors and the engines under them read
it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.plan import EnginePlan
from planner.spec import DType, ModelSpec, StageSpec


@dataclass(slots=True)
class StageContext:
    name: str
    spec: ModelSpec
    stage: StageSpec
    checkpoint: Path  # where components and the tokenizer are loaded from
    device: str  # torch device string: "cpu", "cuda:0"
    max_running_requests: int  # from the plan (falls back to the spec's engine settings)
    kv_tokens: int = 0  # the plan's KV capacity in tokens for this stage; 0 = unlimited
    engine: EnginePlan | None = None  # an autoregressive stage's SGLang engine, as planned
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def dtype(self) -> DType:
        """The dtype the stage's weights are loaded and run in: the spec's, ``auto`` resolved by
        the device (bf16 on a GPU, fp32 on the CPU)."""
        return self.stage.dtype.on(self.device)

    def component_dir(self, stage: str | None = None) -> Path:
        comp = self.spec.stages[stage or self.name].component
        sub = comp.config_dir if comp else ""
        return self.checkpoint / sub if sub else self.checkpoint
