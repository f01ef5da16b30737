"""Building a checkpoint's module tree on PyTorch's ``meta`` device, from its config.json alone.

Architectures that transformers knows are built with transformers' own classes. Two kinds are
described here explicitly instead, because transformers 5.24 cannot build them faithfully:

* ``qwen3_tts`` and ``qwen3_tts_tokenizer_12hz`` (Qwen3-TTS): not in transformers at all
  (:mod:`planner.archs.qwen3_tts`);
* ``qwen3_asr`` with the official nested ``thinker_config``: transformers' ``Qwen3ASRConfig``
  ignores the nesting and silently builds a 2.04 B default model
  (:mod:`planner.archs.qwen3_asr`).

Nothing ever falls back to a default config: an architecture that neither path can build is an
:class:`~planner.errors.ArchitectureError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planner.errors import ArchitectureError

if TYPE_CHECKING:  # torch is imported only when a model is built
    from torch import nn


@dataclass(frozen=True)
class MetaModel:
    """A model built on the meta device, and how it was built."""

    model: nn.Module
    model_type: str
    builder: str  # "transformers:<Class>" or "explicit:<module>"


Builder = Callable[[dict[str, Any]], MetaModel]


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' config warnings (e.g. unknown rope keys) during a meta build."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def explicit_builders() -> dict[str, Builder]:
    """model_type -> explicit builder; checked before transformers' own classes."""
    from planner.archs import qwen3_asr, qwen3_tts

    return {
        "qwen3_tts": qwen3_tts.build_tts,
        "qwen3_tts_tokenizer_12hz": qwen3_tts.build_speech_tokenizer,
        "qwen3_asr": qwen3_asr.build_asr,
    }


# Architecture names that old checkpoints carry but transformers has since renamed.
RENAMED_ARCHITECTURES = {"Qwen2_5OmniModel": "Qwen2_5OmniForConditionalGeneration"}


def build_transformers(config: dict[str, Any]) -> MetaModel:
    """Build with transformers: ``AutoConfig.for_model`` + the class named in ``architectures``."""
    import transformers
    from transformers import AutoConfig

    model_type = config.get("model_type") or ""
    names = list(config.get("architectures") or [])
    classes = [getattr(transformers, RENAMED_ARCHITECTURES.get(n, n), None) for n in names]
    cls: Any = next((c for c in classes if c is not None), None)
    cfg = None
    if model_type:
        try:
            cfg = AutoConfig.for_model(**config)
        except (ValueError, KeyError) as exc:
            if cls is None:
                raise ArchitectureError(
                    f"transformers {transformers.__version__} does not know model_type "
                    f"{model_type!r} and omni-fleet has no explicit description of it ({exc})"
                ) from None
    if cfg is None:
        # A sub-model saved on its own (e.g. Qwen3OmniMoeCode2Wav): the class named in
        # `architectures` brings its config class.
        config_class = getattr(cls, "config_class", None)
        if config_class is None:
            raise ArchitectureError(
                f"config.json has no model_type transformers knows ({model_type!r}) and no "
                f"transformers class in architectures {names}"
            )
        rest = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
        try:
            cfg = config_class(**rest)
        except (TypeError, ValueError) as exc:
            raise ArchitectureError(f"{config_class.__name__}: {exc}") from None
    if cls is None:
        # No (known) architecture named: the auto mappings pick the model class from the config.
        for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
            try:
                cls = auto._model_mapping[type(cfg)]
                break
            except KeyError:
                continue
    if cls is None:
        raise ArchitectureError(
            f"no transformers model class for architectures {names} (model_type {model_type!r})"
        )
    import torch

    with torch.device("meta"):
        model = cls(cfg)
    return MetaModel(model=model, model_type=model_type, builder=f"transformers:{cls.__name__}")


def build(config: dict[str, Any]) -> MetaModel:
    model_type = config.get("model_type", "")
    builder = explicit_builders().get(model_type, build_transformers)
    with quiet_transformers():
        return builder(config)
