"""Audio to another sample rate, one way for every model input: uploads and realtime audio to
the encoders' 16 kHz (worker.api.audio), synthesized speech to the forced aligner's
(worker.models.qwen3_asr)."""

from __future__ import annotations

import numpy as np

_RESAMPLE_SLICE = 1 << 20  # output samples per resampling slice


def resample(audio: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Linear interpolation (numpy only, deterministic, the same values as ``np.interp``),
    computed in slices so that memory stays a few MB above the input and output."""
    if rate == target or audio.size == 0:
        return audio.astype(np.float32, copy=False)
    n_in = audio.size
    n_out = max(1, round(n_in * target / rate))
    out = np.empty(n_out, dtype=np.float32)
    step = rate / target
    for lo in range(0, n_out, _RESAMPLE_SLICE):
        hi = min(n_out, lo + _RESAMPLE_SLICE)
        pos = np.arange(lo, hi, dtype=np.float64) * step
        left = np.minimum(pos.astype(np.int64), n_in - 1)
        right = np.minimum(left + 1, n_in - 1)
        a = audio[left].astype(np.float64)
        out[lo:hi] = (audio[right] - a) * (pos - left) + a
    return out
