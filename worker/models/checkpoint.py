"""Where a spec's weights come from, and how a stage loads its component.

A spec's ``model_dir`` is either a real checkpoint (config.json + safetensors) or a config-only
directory with ``seeded_weights.json`` (tiny test models). For the latter, seeded random weights
are built once into the cache directory, keyed by a digest of the configs, and saved as an
ordinary checkpoint; both cases then load through ``from_pretrained`` on a directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import Any

from planner.spec import ModelSpec, resolve_model_dir

SEED_FILE = "seeded_weights.json"
BUILDER_VERSION = "3"  # bump when the way weights are built changes
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def component_dirs(spec: ModelSpec) -> list[str]:
    """Distinct component sub-directories of the spec, in spec order ('' = model_dir itself)."""
    seen: list[str] = []
    for stage in spec.stages.values():
        if stage.component is not None and stage.component.config_dir not in seen:
            seen.append(stage.component.config_dir)
    return seen


def config_digest(model_dir: Path) -> str:
    """sha256 over every config file under model_dir (not weights), plus the builder version."""
    h = hashlib.sha256(BUILDER_VERSION.encode())
    for path in sorted(model_dir.rglob("*.json")):
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
    import torch
    from transformers.utils import logging as hf_logging

    from worker.models.tokenizer import build_byte_tokenizer

    hf_logging.disable_progress_bar()
    from worker.models.qwen3_omni import tiny

    if tiny.is_tiny(model_dir):  # one config for the whole model: the real checkpoint layout
        tiny.build_checkpoint(model_dir, out, seed)
        return
    from worker.models.qwen3_tts import tiny as tts_tiny

    if tts_tiny.is_tiny(model_dir):  # Qwen3-TTS: not in transformers; our classes, its layout
        tts_tiny.build_checkpoint(model_dir, out, seed)
        return
    from worker.models.qwen3_asr import tiny as asr_tiny

    if asr_tiny.is_tiny(model_dir):  # Qwen3-ASR: our classes, the published layout
        asr_tiny.build_checkpoint(model_dir, out, seed)
        return
    for sub in component_dirs(spec):
        src, dst = model_dir / sub, out / sub
        cls = model_class(src)
        config = cls.config_class.from_pretrained(src)
        # One seed per component so adding a component does not change the others' weights.
        torch.manual_seed(seed + zlib.crc32(sub.encode()))
        model = cls(config).eval()
        _calibrate(model)
        model.save_pretrained(dst)
        for extra in src.iterdir():
            if extra.is_file() and extra.name != "config.json":
                shutil.copyfile(extra, dst / extra.name)
    if not any((model_dir / f).exists() for f in TOKENIZER_FILES):
        build_byte_tokenizer(out)
    for extra in model_dir.iterdir():
        if extra.is_file() and not (out / extra.name).exists():
            shutil.copyfile(extra, out / extra.name)


def _calibrate(model: Any) -> None:
    """Random vocoders are near-silent or clipping; scale the last conv to an audible level."""
    import torch

    from worker.models import codec

    if type(model).__name__ not in ("MimiModel", "Qwen3OmniMoeCode2Wav"):
        return
    for module in model.modules():
        # Mimi's codebooks start as zeros (they are learned as running sums): every code would
        # decode to the same sound. Seeded random codebooks make the codes matter.
        if hasattr(module, "embed_sum") and hasattr(module, "cluster_usage"):
            module.embed_sum.normal_()
            module.cluster_usage.fill_(1.0)
    gen = torch.Generator().manual_seed(0)
    shape = (1, codec.num_quantizers(model), 24)
    codes = torch.randint(0, model.config.codebook_size, shape, generator=gen)
    with torch.no_grad():
        conv = codec.last_conv(model)
        for _ in range(3):  # the clamp makes it nonlinear near full scale
            rms = codec.decode(model, codes).float().pow(2).mean().sqrt().item()
            scale = 0.1 / max(rms, 1e-12)
            conv.weight.mul_(scale)
            if conv.bias is not None:
                conv.bias.mul_(scale)


def model_class(component_dir: Path) -> Any:
    """The transformers class named by ``architectures[0]`` of the component's config.json."""
    import transformers

    config = json.loads((component_dir / "config.json").read_text())
    archs = config.get("architectures") or []
    if not archs:
        raise ValueError(f"{component_dir}/config.json names no architectures")
    cls = getattr(transformers, archs[0], None)
    if cls is None:
        raise ValueError(f"{component_dir}: transformers has no class {archs[0]!r}")
    return cls


def load_component(root: Path, config_dir: str, module: str, dtype: str, device: str) -> Any:
    """from_pretrained on the component's directory, then the named submodule (eval mode)."""
    import torch

    path = root / config_dir if config_dir else root
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}.get(dtype)
    if torch_dtype is None:
        raise ValueError(f"dtype {dtype!r} is not supported by the transformers executor")
    model = model_class(path).from_pretrained(path, dtype=torch_dtype)
    if module:
        model = model.get_submodule(module)
    return model.to(device).eval()
