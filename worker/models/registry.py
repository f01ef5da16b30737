"""The model families, one line each, found by the checkpoint's ``model_type``.

A family is one package (as SGLang-Omni keeps one folder per model) that exports one ``FAMILY``
record (``worker.models.family``): its stage executors and what its API speaks beyond the
common surface. The shipped families live under ``worker/models/`` and are listed in
``SHIPPED``; a family kept outside this repository is any importable package named by the
worker's ``--model-family`` (``OMNI_MODEL_FAMILY``), added with ``add`` in the worker and in
each of its stage processes.

The worker's service resolves its family once, for the endpoints; each stage process resolves
it once, for its executors (``make_executor``: a stage whose component has a config of its own
naming another family is that family's). A checkpoint of no family is ``PLAIN``: a plain
language model, served by the generic executors of ``worker.stages`` (its autoregressive stage
on SGLang's own model class for the checkpoint), with every capability of the record off.
"""

from __future__ import annotations

import functools
import importlib
import json
from pathlib import Path

from planner.spec import Executor
from worker.contract.stage_context import StageContext
from worker.models.family import Family
from worker.stages.base import StageExecutor

# The families shipped with the worker: one line each, the package that exports its FAMILY
SHIPPED = (
    "worker.models.qwen3_omni",
    "worker.models.qwen3_tts",
    "worker.models.qwen3_asr",
)

FAMILIES: dict[str, Family] = {}  # model_type -> its family


def add(*packages: str) -> None:
    """Register the ``FAMILY`` of each package (importable by its dotted name); a ValueError
    names a package that cannot be imported, exports no ``Family`` or claims a model type
    that another family serves. Adding a package again is a no-op."""
    for package in packages:
        try:
            module = importlib.import_module(package)
        except ImportError as exc:
            raise ValueError(f"model family {package!r} cannot be imported: {exc}") from None
        family = getattr(module, "FAMILY", None)
        if not isinstance(family, Family):
            raise ValueError(
                f"model family {package!r} exports no FAMILY = worker.models.family.Family(...)"
            )
        known = FAMILIES.get(family.model_type)
        if known is not None and known is not family:
            raise ValueError(
                f"model family {package!r}: model_type {family.model_type!r} is already "
                f"served by {known.name}"
            )
        FAMILIES[family.model_type] = family
    family_of.cache_clear()


def _generic_executor(ctx: StageContext) -> StageExecutor:
    """A plain language model's stage: the generic executor of its executor kind."""
    kind = ctx.stage.executor
    cls: type[StageExecutor]
    if kind == Executor.PREPROCESS:
        from worker.stages.preprocess import PreprocessExecutor as cls
    elif kind == Executor.AUTOREGRESSIVE:
        from worker.stages.autoregressive import LanguageModelExecutor as cls
    elif kind == Executor.DECODE:
        from worker.stages.decode import DecodeExecutor as cls
    elif kind == Executor.AGGREGATE:
        from worker.stages.aggregate import AggregateExecutor as cls
    else:  # encoders and vocoders are model-specific: their family implements them
        raise ValueError(
            f"stage {ctx.name}: a {kind} stage needs a model family "
            f"({', '.join(f.name for f in FAMILIES.values())}); a plain transformers model "
            "has none"
        )
    return cls(ctx)


# A checkpoint of no family: a plain language model on the generic executors, speaking the
# common surface only (every capability above off)
PLAIN = Family("plain", "", _generic_executor)


@functools.cache
def family_of(model_dir: Path) -> Family:
    """The family of the checkpoint (or config directory) at ``model_dir``; ``PLAIN`` for a
    plain model or where its config.json cannot be read."""
    try:
        model_type = json.loads((model_dir / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return PLAIN
    return FAMILIES.get(model_type, PLAIN)


def make_executor(ctx: StageContext) -> StageExecutor:
    """The executor of one stage, as its family makes it: the family of the component the stage
    holds where the component has a config of its own that names one (a Qwen3-ForcedAligner
    beside a Qwen3-TTS checkpoint is Qwen3-ASR's), else the checkpoint's."""
    comp = ctx.stage.component
    family = family_of(ctx.component_dir()) if comp is not None and comp.config_dir else PLAIN
    if family is PLAIN:
        family = family_of(ctx.checkpoint)
    return family.make_executor(ctx)


add(*SHIPPED)
