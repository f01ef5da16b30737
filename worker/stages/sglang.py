"""The seam for an SGLang-backed autoregressive executor (GPU only, not implemented yet).

It will implement the same ``StageExecutor`` interface: ``start`` submits to SGLang's scheduler
(which batches at the step level itself and owns the paged KV cache sized by the plan's
``engine_fraction``), ``step`` drains the tokens and hidden states SGLang produced since the
last call, ``abort`` cancels in SGLang. Selected by ``engine.backend: sglang`` in the spec.
"""

from __future__ import annotations

from typing import Any

from worker.stages.base import Output, RequestMeta, StageContext, StageExecutor

_MESSAGE = "engine.backend 'sglang' is not implemented yet; use backend 'transformers'"


class SGLangExecutor(StageExecutor):
    def __init__(self, ctx: StageContext) -> None:
        raise NotImplementedError(f"stage {ctx.name}: {_MESSAGE}")

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        raise NotImplementedError(_MESSAGE)

    def abort(self, rid: str) -> None:
        raise NotImplementedError(_MESSAGE)

    def next_deadline(self) -> float | None:
        raise NotImplementedError(_MESSAGE)

    def step(self) -> list[Output]:
        raise NotImplementedError(_MESSAGE)

    def queue_depth(self) -> int:
        raise NotImplementedError(_MESSAGE)
