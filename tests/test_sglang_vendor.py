"""The SGLang vendor layer's own parts (worker/engines/sglang): the seeded-sampling hash it
supplies on CPUs equals MurmurHash3, and its platform steps aside on GPU hosts."""

from __future__ import annotations

import struct

import mmh3
import pytest
import torch

from worker.engines.sglang import PINNED, installed
from worker.engines.sglang.patches import murmur_hash32


def test_the_cpu_hash_is_murmurhash3_of_seed_position_and_column() -> None:
    seeds = torch.tensor([0, 42, 2**40 + 7, 2**62 - 1], dtype=torch.int64)
    positions = torch.tensor([0, 5, 99_999, 2**31 - 1])
    columns = torch.arange(0, 152_064, 1_999)
    got = murmur_hash32(seeds, positions, columns)
    assert got.dtype == torch.uint32 and got.shape == (4, len(columns))
    for i, (seed, pos) in enumerate(zip(seeds.tolist(), positions.tolist(), strict=True)):
        for j, col in enumerate(columns.tolist()):
            block = struct.pack("<IIII", seed & 0xFFFFFFFF, seed >> 32, pos, col)
            assert int(got[i, j]) == mmh3.hash(block, 0, signed=False)


def test_the_pinned_sglang_is_installed() -> None:
    """The lock (uv.lock) installs the one version the vendor layer patches."""
    assert installed(), f"SGLang {PINNED} (uv.lock, scripts/install.sh)"


def test_the_platform_is_for_hosts_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.engines import sglang

    sglang.load()
    from worker.engines.sglang import platform

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert platform.activate() == "worker.engines.sglang.platform.OmniCpuPlatform"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert platform.activate() is None  # SGLang's CUDA platform and kernels
