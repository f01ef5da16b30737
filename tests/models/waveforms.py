"""One comparison of a served waveform with a reference's, frame by frame, for every family's
reference tests: a failure names the first frame that differs and its SNR there."""

from __future__ import annotations

import numpy as np

TOLERANCE = 2  # int16 steps: a stream decoded in pieces rounds floats differently from one pass


def assert_same_waveform(pcm: np.ndarray, want: np.ndarray, frame: int, what: str) -> None:
    """``pcm`` (int16) equals ``want`` (int16 or the same values as floats) within
    ``TOLERANCE`` at every sample; ``frame`` is the samples of one codec frame."""
    want = np.asarray(want).astype(np.int32)
    assert pcm.shape == want.shape, (
        f"{what}: {pcm.size / frame:.1f} frames, the reference's {want.size / frame:.1f}"
    )
    diff = np.abs(pcm.astype(np.int32) - want)
    frames = -(-diff.size // frame)
    padded = np.zeros(frames * frame, np.int32)
    padded[: diff.size] = diff
    off = padded.reshape(frames, frame).max(axis=1) > TOLERANCE
    if off.any():
        k = int(np.argmax(off))
        ref = want[k * frame : (k + 1) * frame].astype(np.float64)
        err = pcm[k * frame : (k + 1) * frame].astype(np.float64) - ref
        snr = 10 * np.log10(max(float(ref @ ref), 1e-9) / max(float(err @ err), 1e-9))
        raise AssertionError(
            f"{what}: frame {k} of {frames} is the first that differs from the reference "
            f"({snr:.1f} dB SNR there); {int(off.sum())} frames differ"
        )
