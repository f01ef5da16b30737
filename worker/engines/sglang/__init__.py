"""SGLang, composed: its scheduler and model runner under the project's autoregressive stages.

What is here, and nowhere else:
- ``patches``: every patch of SGLang, each with why and the SGLang lines;
- ``platform``: the out-of-tree platform that runs SGLang's engine on a CPU (CI runs the code
  path a GPU host runs);
- nothing of a model: a family's model classes live with the family and register themselves in
  SGLang's model registry when its stage loads (``worker/models/qwen3_omni/thinker_sglang.py``,
  the ``talker_sglang.py`` of ``qwen3_omni`` and ``qwen3_tts``);
- ``engine``: SGLang's scheduler run inside a stage process, behind ``worker.engines.base``;
- ``talkers``: what those talker classes do alike (their engine settings, their prompt rows,
  their picks handed to SGLang's sampler).

One SGLang version is supported (``PINNED``), the one both locks pin (docs/install.md). ``load``
is the one way in: it applies the patches around the first import.
"""

from __future__ import annotations

from importlib import metadata
from types import ModuleType

PINNED = "0.5.23"

_loaded: ModuleType | None = None


def load() -> ModuleType:
    """``sglang``, patched; a RuntimeError naming the fix when it is missing or another
    version."""
    global _loaded
    if _loaded is not None:
        return _loaded
    try:
        version = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        raise RuntimeError(
            f"SGLang {PINNED} is not installed: run scripts/install.sh (CPU hosts) or "
            "`uv sync --frozen --project deploy/gpu` (GPU hosts; docs/install.md)"
        ) from None
    if version != PINNED:
        raise RuntimeError(
            f"SGLang {version} is installed; this build composes SGLang {PINNED} (its vendor "
            "layer, worker/engines/sglang/, patches that version's lines)"
        )
    from worker.engines.sglang import patches

    patches.before_import()
    import sglang.srt.managers.scheduler

    patches.after_import()
    import sglang

    _loaded = sglang
    return sglang


def installed() -> bool:
    try:
        return metadata.version("sglang") == PINNED
    except metadata.PackageNotFoundError:
        return False
