"""The SGLang vendor layer's own parts (worker/engines/sglang): the seeded-sampling hash it
supplies on CPUs equals MurmurHash3, and its platform steps aside on GPU hosts."""

from __future__ import annotations

import struct
from importlib.metadata import requires
from pathlib import Path

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
    """scripts/install.sh installs the one version the vendor layer patches."""
    assert installed(), f"SGLang {PINNED} (scripts/install.sh)"


def test_a_gpu_hosts_install_is_sglangs_requirements_but_two_pins() -> None:
    """scripts/sglang-gpu.txt is what the pinned SGLang requires (its package metadata) but its
    transformers and xgrammar pins, which the project's own ranges replace (SGLang and the
    project cannot be resolved together with them); the documented lines install that SGLang."""
    repo = Path(__file__).resolve().parents[1]
    listed = [line for line in (repo / "scripts" / "sglang-gpu.txt").read_text().splitlines()
              if line and not line.startswith("#")]  # fmt: skip
    own = [r for r in requires("sglang") or [] if "extra ==" not in r]
    replaced = ("transformers==", "xgrammar==")
    assert sorted(listed) == sorted(r for r in own if not r.startswith(replaced))
    assert sum(r.startswith(replaced) for r in own) == 2, "SGLang's pins moved: check the list"
    docs = (repo / "docs" / "omni-worker.md").read_text()
    assert f"pip install --no-deps sglang=={PINNED}" in docs
    assert 'pip install "omni-fleet[worker,grammar]" -r scripts/sglang-gpu.txt' in docs


def test_the_platform_is_for_hosts_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.engines import sglang

    sglang.load()
    from worker.engines.sglang import platform

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert platform.activate() == "worker.engines.sglang.platform.OmniCpuPlatform"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert platform.activate() is None  # SGLang's CUDA platform and kernels
