"""Codec decoders (vocoders) behind one call: codes (B, Q, T) -> waveform (B, samples)."""

from __future__ import annotations

from typing import Any


def samples_per_frame(model: Any) -> int:
    cfg = model.config
    if hasattr(model, "total_upsample"):  # Qwen3-Omni code2wav
        return int(model.total_upsample)
    return round(cfg.sampling_rate / cfg.frame_rate)  # Mimi-style codecs


def num_quantizers(model: Any) -> int:
    return int(model.config.num_quantizers)


def decode(model: Any, codes: Any) -> Any:
    """Float waveform in [-1, 1], shape (B, samples)."""
    wav = model(codes) if hasattr(model, "total_upsample") else model.decode(codes).audio_values
    return wav[:, 0].clamp(-1.0, 1.0)


def last_conv(model: Any) -> Any:
    import torch

    convs = [m for m in model.decoder.modules() if isinstance(m, torch.nn.Conv1d)]
    return convs[-1]
