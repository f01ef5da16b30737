"""Embedded tiny Qwen3-ASR checkpoints: the published layout at toy size, seeded random weights
(omni-fleet's classes, the official tensor names), a byte-level tokenizer with the audio and role
tokens the tiny configs name, a chat template (system turn, user turn with the audio) and the
Whisper feature extractor's config; with a ``forced_aligner/`` config, the Qwen3-ForcedAligner
checkpoint beside it (its tokenizer adds ``<timestamp>``). Written once into the cache, then
loaded like a real one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",  # 256
    "<|im_start|>",  # 257
    "<|im_end|>",  # 258
    "<|audio_start|>",  # 259
    "<|audio_end|>",  # 260
    "<|audio_pad|>",  # 261
    "<asr_text>",  # 262
]
ROLE_TOKENS = ["system", "user", "assistant"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'audio' %}<|audio_start|><|audio_pad|><|audio_end|>"
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def is_tiny(config_dir: Path) -> bool:
    try:
        return json.loads((config_dir / "config.json").read_text()).get("model_type") == "qwen3_asr"
    except (OSError, ValueError):
        return False


def build_checkpoint(config_dir: Path, out: Path, seed: int) -> None:
    """The checkpoint, and its forced aligner (``forced_aligner/``, its own seed) when the
    config directory has one."""
    from worker.models.qwen3_asr.aligner import ALIGNER_DIR

    _build_one(config_dir, out, seed)
    if (config_dir / ALIGNER_DIR / "config.json").is_file():
        _build_one(config_dir / ALIGNER_DIR, out / ALIGNER_DIR, seed + 1)


def _build_one(config_dir: Path, out: Path, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    from worker.models.qwen3_asr.aligner import TIMESTAMP
    from worker.models.qwen3_asr.modeling import Qwen3ASRModel
    from worker.models.tokenizer import build_byte_tokenizer

    config = json.loads((config_dir / "config.json").read_text())
    specials = SPECIAL_TOKENS + ([TIMESTAMP] if "timestamp_token_id" in config else [])
    model = Qwen3ASRModel(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            base = torch.ones_like(p) if p.ndim == 1 and "norm" in _ else torch.zeros_like(p)
            p.copy_(base + torch.randn(p.shape, generator=gen) * 0.2)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out / "model.safetensors")
    build_byte_tokenizer(out, specials, ROLE_TOKENS, chat_template=None)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    for name in ("config.json", "preprocessor_config.json"):
        shutil.copyfile(config_dir / name, out / name)
