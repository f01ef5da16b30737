"""A checkpoint's ``generation_config.json`` as the decoding stages read it: the tokens that end
a reply (``eos_token_id``, an int or a list) and the tokens never to emit
(``suppress_tokens``), as transformers' ``generate`` applies them, and how a request that leaves
a sampling field unset samples."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StopTokens:
    eos: frozenset[int]
    suppress: tuple[int, ...]

    def suppress_mask(self, torch: Any, vocab: int, device: Any) -> Any:
        """A bool mask over the vocabulary: True where a token is never emitted."""
        mask = torch.zeros(vocab, dtype=torch.bool, device=device)
        for t in self.suppress:
            if 0 <= t < vocab:
                mask[t] = True
        return mask


def _ids(value: object) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []


def read_generation_config(directory: Path) -> dict[str, Any]:
    """``directory/generation_config.json`` (empty where the checkpoint has none)."""
    path = Path(directory) / "generation_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def stop_tokens(
    directory: Path, config_eos: object = None, always: tuple[int, ...] = ()
) -> StopTokens:
    """``directory``'s generation config (none: the model config's ``config_eos``), plus the
    ``always`` tokens a family's chat format ends turns with (Qwen's ``<|im_end|>``)."""
    gen = read_generation_config(directory)
    eos = _ids(gen["eos_token_id"]) if "eos_token_id" in gen else _ids(config_eos)
    return StopTokens(frozenset(eos) | frozenset(always), tuple(_ids(gen.get("suppress_tokens"))))


SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_defaults(directory: Path) -> dict[str, Any]:
    """What a request that leaves a sampling field unset gets: the checkpoint's own
    ``temperature``, ``top_p``, ``top_k``, ``min_p`` and ``repetition_penalty`` (Qwen3-8B:
    0.6, 0.95, 20), as SGLang's and vLLM's servers take them; greedy where the checkpoint says
    ``do_sample: false``, and where it says nothing."""
    gen = read_generation_config(directory)
    if gen.get("do_sample") is False:
        return {"temperature": 0.0}
    return {k: gen[k] for k in SAMPLING_FIELDS if gen.get(k) is not None}
