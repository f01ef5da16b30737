"""Where a spec's weights come from.

A spec's ``model_dir`` is either a real checkpoint (config.json + safetensors) or a config-only
directory with ``seeded_weights.json`` (tiny test models). For the latter, seeded random weights
are built once into the cache directory, keyed by a digest of the configs, and saved as an
ordinary checkpoint; both cases are then a checkpoint directory, from which each stage loads
only its own tensors (``worker.layers.stage_weights``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from planner.spec import ModelSpec, resolve_model_dir

SEED_FILE = "seeded_weights.json"
BUILDER_VERSION = "5"  # bump when the way checkpoints are built changes (weights, templates)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def config_digest(model_dir: Path) -> str:
    """sha256 over every config file under model_dir (not weights; linked folders followed, such
    as a forced aligner's beside its model), plus the builder version."""
    h = hashlib.sha256(BUILDER_VERSION.encode())
    found = (Path(d) / f for d, _, fs in os.walk(model_dir, followlinks=True) for f in fs)
    for path in sorted(p for p in found if p.suffix == ".json"):
        h.update(str(path.relative_to(model_dir)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def resolve_checkpoint(spec: ModelSpec, spec_path: Path, cache_dir: Path, log=print) -> Path:
    """The directory stages load from: model_dir, or the seeded checkpoint built in cache_dir."""
    model_dir = resolve_model_dir(spec, spec_path)
    if not (model_dir / SEED_FILE).is_file():
        return model_dir
    seed = int(json.loads((model_dir / SEED_FILE).read_text())["seed"])
    final = Path(cache_dir) / f"{spec.name}-{config_digest(model_dir)}"
    if (final / "complete").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    log(f"building seeded weights for {spec.name} in {final}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        _build_seeded(spec, model_dir, tmp, seed)
        (tmp / "complete").write_text("ok\n")
        try:
            # Atomic: concurrent workers each build into their own temp dir; the first rename
            # wins and the others discard theirs (rename onto a non-empty dir fails).
            os.rename(tmp, final)
        except OSError:
            if not (final / "complete").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _build_seeded(spec: ModelSpec, model_dir: Path, out: Path, seed: int) -> None:
    """The checkpoint by its family's tiny builder; then each component of the spec whose
    config names another family (a Qwen3-ForcedAligner beside Qwen3-TTS) by that family's,
    where the first did not write it (its own seed: ``seed`` + 1)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    _tiny_builder(model_dir).build_checkpoint(model_dir, out, seed)
    for stage in spec.stages.values():
        sub = stage.component.config_dir if stage.component else ""
        if sub and not (out / sub / "config.json").is_file():
            _tiny_builder(model_dir / sub).build_checkpoint(model_dir / sub, out / sub, seed + 1)


def _tiny_builder(config_dir: Path) -> Any:
    import importlib

    from worker.models.registry import FAMILIES

    for family in FAMILIES.values():
        builder = importlib.import_module(family.tiny_builder) if family.tiny_builder else None
        if builder is not None and builder.is_tiny(config_dir):
            return builder
    raise ValueError(
        f"{config_dir}: no tiny-checkpoint builder knows this model (those of "
        f"{', '.join(f.name for f in FAMILIES.values() if f.tiny_builder)}, under worker/models/)"
    )
