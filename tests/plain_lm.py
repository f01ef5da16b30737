"""A tiny plain language model checkpoint: what a bare LLM download (configs/models/qwen3-8b.yaml's
Qwen/Qwen3-8B) looks like at toy size, a seeded ``Qwen3ForCausalLM`` with a byte-level tokenizer
and a chat template, sampling by default as Qwen3's generation config says."""

from __future__ import annotations

import json
from pathlib import Path

# Qwen3-8B's generation_config.json sampling (its eos and pad are the tiny vocabulary's)
SAMPLING = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}


def build_plain_lm(out: Path) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from worker.models.tokenizer import build_byte_tokenizer

    config = Qwen3Config(
        vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
        bos_token_id=257, eos_token_id=258, pad_token_id=256, initializer_range=0.3,
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(out)
    generation = {"bos_token_id": 257, "eos_token_id": 258, "pad_token_id": 256, **SAMPLING}
    (out / "generation_config.json").write_text(json.dumps(generation))
    build_byte_tokenizer(out)
    return out
