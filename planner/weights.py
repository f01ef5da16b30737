"""Exact weight counts and KV-cache geometry from a checkpoint's config.json.

What is counted, per component (``ComponentSpec.module`` minus ``exclude``):
* every parameter once: tied weights (one ``nn.Parameter`` reachable under two names) count
  once, as ``model.parameters()`` does, and as a checkpoint stores them;
* every *persistent* buffer once (those in ``state_dict()``, e.g. codec codebook statistics);
  non-persistent buffers (rotary ``inv_freq``, index tables) are recomputed at load time and
  are not counted.
Bytes = (parameters + persistent buffers) x the stage's dtype bytes.

Meta builds are cached in memory per (config path, mtime, size), and their results on disk per
config content (:mod:`planner.diskcache`), so repeated plans never rebuild.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from planner.archs import MetaModel, build
from planner.diskcache import memo
from planner.errors import ArchitectureError, SpecError

if TYPE_CHECKING:  # torch is imported only when a model is built
    from torch import nn


@dataclass(frozen=True)
class WeightCount:
    params: int
    buffers: int  # persistent buffer elements

    @property
    def elements(self) -> int:
        return self.params + self.buffers


@dataclass(frozen=True)
class KvLayout:
    """Per-token KV geometry of the decoder that an autoregressive component runs."""

    layers: int
    kv_heads: int
    head_dim: int
    latent_dim: int = 0  # MLA (compressed KV): elements per layer per token; 0 = regular

    def bytes_per_token(self, dtype_bytes: int, tp_size: int = 1) -> int:
        """Per TP rank; KV heads are split across ranks (replicated when fewer than ranks)."""
        if self.latent_dim:
            return self.layers * self.latent_dim * dtype_bytes
        heads = math.ceil(self.kv_heads / tp_size)
        return self.layers * heads * self.head_dim * 2 * dtype_bytes


def config_path(model_dir: Path, config_dir: str = "") -> Path:
    path = (model_dir / config_dir / "config.json") if config_dir else model_dir / "config.json"
    if not path.is_file():
        raise SpecError(f"no config.json at {path}")
    return path


def _key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return (str(path.resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=32)
def _meta(key: tuple[str, int, int]) -> MetaModel:
    path = Path(key[0])
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"{path}: cannot read config.json ({exc})") from None
    if not isinstance(config, dict):
        raise SpecError(f"{path}: config.json is not a JSON object")
    try:
        return build(config)
    except ArchitectureError as exc:
        raise ArchitectureError(f"{path}: {exc}") from None


def meta_model(path: Path) -> MetaModel:
    """The meta-device model of one config.json (cached until the file changes)."""
    return _meta(_key(path))


def clear_cache() -> None:
    _meta.cache_clear()
    _count.cache_clear()
    _kv.cache_clear()
    _shape.cache_clear()


def _submodule(meta: MetaModel, dotted: str, path: Path) -> nn.Module:
    if not dotted:
        return meta.model
    try:
        return meta.model.get_submodule(dotted)
    except AttributeError:
        parent, _, leaf = dotted.rpartition(".")
        try:
            scope = meta.model.get_submodule(parent) if parent else meta.model
        except AttributeError:
            scope = meta.model
        children = [n for n, _ in scope.named_children()]
        from planner.errors import unknown

        raise SpecError(unknown("module", leaf, children, f"{path} ({meta.builder})")) from None


@dataclass(frozen=True)
class NamedTensor:
    names: tuple[str, ...]  # every checkpoint name of one tensor (tied weights have several)
    numel: int
    is_param: bool


def named_tensors(model: nn.Module) -> list[NamedTensor]:
    """Every tensor a checkpoint of ``model`` stores: parameters and persistent buffers, each
    once, with all the names it is reachable under."""
    names: dict[int, list[str]] = {}
    tensors: dict[int, tuple[int, bool]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
        tensors[id(p)] = (p.numel(), True)
    for mod_name, sub in model.named_modules(remove_duplicate=False):
        for name, buf in sub._buffers.items():
            if buf is not None and name not in sub._non_persistent_buffers_set:
                names.setdefault(id(buf), []).append(f"{mod_name}.{name}" if mod_name else name)
                tensors[id(buf)] = (buf.numel(), False)
    return [NamedTensor(tuple(dict.fromkeys(names[k])), n, p) for k, (n, p) in tensors.items()]


@functools.lru_cache(maxsize=256)
def _count(key: tuple[str, int, int], module: str, exclude: tuple[str, ...]) -> WeightCount:
    query = ("count", module, list(exclude))
    return WeightCount(
        **memo(Path(key[0]), query, lambda: asdict(_count_meta(key, module, exclude)))
    )


def _count_meta(key: tuple[str, int, int], module: str, exclude: tuple[str, ...]) -> WeightCount:
    from planner.components import owns_tensor
    from planner.spec import ComponentSpec

    path = Path(key[0])
    meta = _meta(key)
    _submodule(meta, module, path)  # a precise error for a module the model does not have
    for name in exclude:
        _submodule(meta, f"{module}.{name}" if module else name, path)
    component = ComponentSpec(module=module, exclude=list(exclude))
    params = buffers = 0
    for tensor in named_tensors(meta.model):
        if owns_tensor(component, tensor.names):
            params += tensor.numel * tensor.is_param
            buffers += tensor.numel * (not tensor.is_param)
    return WeightCount(params=params, buffers=buffers)


def count_weights(path: Path, module: str = "", exclude: tuple[str, ...] = ()) -> WeightCount:
    """Exact counts of ``module`` (dotted, '' = whole model) minus ``exclude`` (relative)."""
    return _count(_key(path), module, tuple(exclude))


def _text_config(module: nn.Module, meta: MetaModel):
    cfg = getattr(module, "config", None) or getattr(meta.model, "config", None)
    if cfg is None:
        return None
    get = getattr(cfg, "get_text_config", None)
    return get() if callable(get) else cfg


@functools.lru_cache(maxsize=256)
def _kv(key: tuple[str, int, int], module: str) -> KvLayout:
    return KvLayout(**memo(Path(key[0]), ("kv", module), lambda: asdict(_kv_meta(key, module))))


def _kv_meta(key: tuple[str, int, int], module: str) -> KvLayout:
    path = Path(key[0])
    meta = _meta(key)
    cfg = _text_config(_submodule(meta, module, path), meta)
    where = f"{path} module {module or '<whole model>'}"
    if cfg is None:
        raise ArchitectureError(f"{where}: no decoder config to size a KV cache from")
    layers = getattr(cfg, "num_hidden_layers", None)
    heads = getattr(cfg, "num_attention_heads", None)
    if not layers or not heads:
        raise ArchitectureError(f"{where}: config has no num_hidden_layers/num_attention_heads")
    if getattr(cfg, "kv_lora_rank", None):  # MLA: one compressed latent + rope key per layer
        latent = cfg.kv_lora_rank + getattr(cfg, "qk_rope_head_dim", 0)
        return KvLayout(layers=layers, kv_heads=1, head_dim=latent, latent_dim=latent)
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return KvLayout(layers=layers, kv_heads=kv_heads, head_dim=head_dim)


def kv_layout(path: Path, module: str = "") -> KvLayout:
    return _kv(_key(path), module)


@dataclass(frozen=True)
class DecoderShape:
    """What the activation estimate of an autoregressive stage needs, and the longest context
    it was trained for (``max_position_embeddings``; 0: the config does not say)."""

    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    max_positions: int = 0


def decoder_shape(path: Path, module: str = "") -> DecoderShape:
    return _shape(_key(path), module)


@functools.lru_cache(maxsize=256)
def _shape(key: tuple[str, int, int], module: str) -> DecoderShape:
    query = ("shape", module)
    return DecoderShape(**memo(Path(key[0]), query, lambda: asdict(_shape_meta(key, module))))


def _shape_meta(key: tuple[str, int, int], module: str) -> DecoderShape:
    path = Path(key[0])
    meta = _meta(key)
    cfg = _text_config(_submodule(meta, module, path), meta)
    return DecoderShape(
        hidden_size=getattr(cfg, "hidden_size", 0) or 0,
        vocab_size=getattr(cfg, "vocab_size", 0) or 0,
        num_attention_heads=getattr(cfg, "num_attention_heads", 0) or 0,
        max_positions=getattr(cfg, "max_position_embeddings", 0) or 0,
    )
