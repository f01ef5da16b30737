"""The seam for an SGLang-backed autoregressive executor (GPU only, not implemented yet).

It will implement the same ``StageExecutor`` interface: ``start`` submits to SGLang's scheduler
(which batches at the step level itself), ``step`` drains finished tokens and hidden states.
"""

from __future__ import annotations

from worker.stages.base import StageContext, StageExecutor


class SGLangExecutor(StageExecutor):
    def __init__(self, ctx: StageContext) -> None:
        raise NotImplementedError(
            f"stage {ctx.name}: engine.backend 'sglang' is not implemented yet; "
            "use backend 'transformers'"
        )
