"""The GPU catalog (configs/gpus.yaml): capacities and the tunable memory estimates."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from planner.errors import InventoryError, unknown

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_CATALOG = CONFIGS_DIR / "gpus.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ActivationEstimates(_Strict):
    autoregressive_factor: float = Field(24, ge=0)
    encoder_bytes: int = Field(256 << 20, ge=0)
    vocoder_bytes: int = Field(256 << 20, ge=0)
    aggregate_bytes: int = Field(0, ge=0)


class Estimates(_Strict):
    """The policy and estimates a GPU type uses; each GPU entry may override any field."""

    reserved_bytes: int = Field(1 << 30, ge=0)
    runtime_bytes_per_process: int = Field(576 << 20, ge=0)
    # the part of the runtime the CUDA driver holds outside torch's caching allocator (the
    # context): what a process's allocator cap leaves out of its footprint
    cuda_context_bytes: int = Field(512 << 20, ge=0)
    cuda_graph_bytes: int = Field(384 << 20, ge=0)
    activations: ActivationEstimates = Field(default_factory=ActivationEstimates)


class GpuType(_Strict):
    name: str
    memory_bytes: int = Field(gt=0)
    names: tuple[str, ...] = ()
    # SGLang's attention backend for bf16/fp16 engines on this architecture (what SGLang 0.5.23
    # picks itself: FlashAttention 3 on Hopper, TensorRT-LLM's on Blackwell, FlashInfer before;
    # arg_groups/model_override_base.py, get_default_attn_backend); fp32 engines run triton
    attention_backend: str = "flashinfer"
    estimates: Estimates = Field(default_factory=Estimates)

    @property
    def usable_bytes(self) -> int:
        return self.memory_bytes - self.estimates.reserved_bytes

    def allocator_fraction(self, footprint_bytes: int) -> float:
        """The share of this GPU a process's caching allocator may hold when the plan gives
        the process ``footprint_bytes`` on it: all of it but the CUDA context, which the
        driver holds outside the allocator (``torch.cuda.set_per_process_memory_fraction``
        caps the allocator's reserved bytes only)."""
        held = max(footprint_bytes - self.estimates.cuda_context_bytes, 0)
        # (rounded up, at a millionth of the GPU: the cap never cuts into the footprint)
        return min(1.0, math.ceil(held / self.memory_bytes * 1e6) / 1e6)


class Catalog(_Strict):
    defaults: Estimates
    gpus: dict[str, GpuType]

    def get(self, name: str) -> GpuType:
        """A catalog entry by its catalog name or by an NVML/torch device name."""
        if name in self.gpus:
            return self.gpus[name]
        lowered = name.strip().lower()
        for gpu in self.gpus.values():
            if lowered == gpu.name.lower() or lowered in (n.lower() for n in gpu.names):
                return gpu
        raise InventoryError(unknown("GPU type", name, self.gpus, "configs/gpus.yaml"))

    def match_device(self, device_name: str, total_bytes: int) -> GpuType:
        """Map a detected device onto an entry, or onto a generic entry with its real bytes.

        The reported bytes always win: a MIG slice or a variant with a different memory size
        must never be planned with the catalog's full-size capacity.
        """
        try:
            gpu = self.get(device_name)
        except InventoryError:
            label = f"GPU-{round(total_bytes / 2**30)}GiB"
            return GpuType(
                name=label, memory_bytes=total_bytes, names=(device_name,), estimates=self.defaults
            )
        if gpu.memory_bytes == total_bytes:
            return gpu
        return gpu.model_copy(
            update={"name": f"{gpu.name}@{total_bytes}", "memory_bytes": total_bytes}
        )


def _merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime_ns: int) -> Catalog:
    raw = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, dict) or "gpus" not in raw:
        raise InventoryError(f"{path}: expected a mapping with 'defaults' and 'gpus'")
    defaults = raw.get("defaults") or {}
    try:
        base = Estimates.model_validate(defaults)
        gpus = {}
        for name, entry in (raw["gpus"] or {}).items():
            entry = dict(entry or {})
            own = {k: entry.pop(k) for k in list(entry) if k in Estimates.model_fields}
            estimates = Estimates.model_validate(_merge(base.model_dump(), own))
            gpus[name] = GpuType(name=name, estimates=estimates, **entry)
    except ValidationError as exc:
        raise InventoryError(f"{path}: {exc}") from None
    return Catalog(defaults=base, gpus=gpus)


def load_catalog(path: Path | str | None = None) -> Catalog:
    """The catalog, cached until the file changes."""
    p = Path(path or DEFAULT_CATALOG).resolve()
    return _load(str(p), p.stat().st_mtime_ns)
