"""Embedded tiny Qwen3-TTS checkpoints: the published layout at toy size, seeded random weights.

``configs/hf/tiny-qwen3-tts-*`` hold configs in the published format (``config.json``,
``generation_config.json``, ``speech_tokenizer/config.json``) and ``seeded_weights.json``.
On first use the worker writes, into its cache directory, what a published checkpoint holds:
``model.safetensors`` (talker, code predictor and, on Base, the speaker encoder, under their
published names), ``speech_tokenizer/model.safetensors`` (Mimi encoder under the names
transformers 4.57 wrote, 12 Hz decoder), a byte-level tokenizer with the special tokens the
configs name, and the feature extractor's config. From then on it loads like a real one.
Its audio is meaningless; its computation is the real one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# Byte-level vocabulary: ids 0..255 are bytes, then these (the tiny configs name these ids:
# im_start 257, im_end 258, tts_pad 259, tts_bos 260, tts_eos 261, assistant 262).
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
]
ROLE_TOKENS = ["assistant", "user", "system"]


def is_tiny(config_dir: Path) -> bool:
    try:
        cfg = json.loads((config_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return cfg.get("model_type") == "qwen3_tts"


def build_tokenizer(out: Path) -> None:
    from worker.models.tokenizer import build_byte_tokenizer

    build_byte_tokenizer(out, SPECIAL_TOKENS, ROLE_TOKENS, chat_template=None)


def _old_mimi_name(name: str) -> str:
    """transformers 5's Mimi module name -> the name transformers 4.57 wrote (the published)."""
    for new, old in (
        ("encoder.encoder_seanet.layers.", "encoder.layers."),
        ("encoder.encoder_transformer.", "encoder_transformer."),
        ("encoder.downsample.", "downsample."),
    ):
        if name.startswith(new):
            return old + name[len(new) :]
    return name


def build_checkpoint(config_dir: Path, out: Path, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    from worker.layers.qwen3_decoder import init_random
    from worker.models.qwen3_tts.codec import SpeechTokenizer
    from worker.models.qwen3_tts.modeling import Qwen3TTSModel

    config = json.loads((config_dir / "config.json").read_text())
    model = Qwen3TTSModel(config)
    init_random(model, seed)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out / "model.safetensors")

    st_dir = out / "speech_tokenizer"
    st_dir.mkdir(exist_ok=True)
    st_cfg = json.loads((config_dir / "speech_tokenizer" / "config.json").read_text())
    torch.manual_seed(seed + 1)  # the layers' own initialisation, under which the noise is added
    st = SpeechTokenizer(st_cfg, with_encoder=True)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, t in list(st.named_parameters()) + list(st.named_buffers()):
            if not t.is_floating_point() or name.endswith("initialized"):
                continue
            if name.endswith("cluster_usage"):
                t.copy_(1.0 + torch.rand(t.shape, generator=gen))
            else:
                t.add_(torch.randn(t.shape, generator=gen) * 0.05)
        _calibrate(st, gen)
    assert st.decoder is not None and st.encoder is not None  # built with both halves
    tensors = {"decoder." + k: v for k, v in st.decoder.state_dict().items()}
    tensors |= {"encoder." + _old_mimi_name(k): v for k, v in st.encoder.state_dict().items()}
    save_file({k: v.contiguous() for k, v in tensors.items()}, st_dir / "model.safetensors")
    (st_dir / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "chunk_length_s": None,
                "feature_extractor_type": "EncodecFeatureExtractor",
                "feature_size": 1,
                "overlap": None,
                "padding_side": "right",
                "padding_value": 0.0,
                "return_attention_mask": True,
                "sampling_rate": 24000,
            },
            indent=2,
        )
    )
    build_tokenizer(out)
    # the configs of what this builder wrote, named: a config directory may link in another
    # family's component (tiny-qwen3-tts-aligned's forced_aligner/), which that family's builder
    # writes, and links to directories are where rglob does not look (speech_tokenizer/ there)
    for sub in ("", "speech_tokenizer"):
        for src in (config_dir / sub).glob("*.json"):
            if src.name != "seeded_weights.json":
                shutil.copyfile(src, out / sub / src.name)


def _calibrate(st, gen) -> None:
    """Scale the decoder's last convolution so random codes give an audible, unclipped level."""
    import torch

    dec = st.decoder
    codes = torch.randint(0, dec.cfg["codebook_size"], (1, dec.num_quantizers, 20), generator=gen)
    conv = dec.decoder[-1].conv
    for _ in range(3):
        rms = dec(codes).float().pow(2).mean().sqrt().item()
        scale = 0.1 / max(rms, 1e-12)
        conv.weight.mul_(scale)
        conv.bias.mul_(scale)
