"""The SGLang vendor layer's own parts (worker/engines/sglang): the seeded-sampling hash it
supplies on CPUs equals MurmurHash3, and its platform steps aside on GPU hosts."""

from __future__ import annotations

import struct
from pathlib import Path

import mmh3
import pytest
import torch

from worker.engines.sglang import PINNED, installed
from worker.engines.sglang.patches import murmur_hash32

REAL = Path(__file__).resolve().parents[1] / "configs" / "hf" / "Qwen--Qwen3-Omni-30B-A3B-Instruct"


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


def test_the_plan_governs_sglangs_memory_on_a_gpu_host() -> None:
    """The colocated 30B speech spec on one H200: each SGLang stage's server arguments carry its
    process's planned share of the GPU (``mem_fraction_static``), the plan's KV pool in tokens
    (``max_total_tokens``, which SGLang's profiled pool is then checked against), the spec's
    context (within the checkpoint's trained positions) and the KV cache's dtype."""
    from planner.api import plan_spec
    from worker.contract.stage_context import StageContext
    from worker.engines import sglang as vendor
    from worker.engines.sglang.engine import EngineSettings, _server_args

    vendor.load()
    planned = plan_spec("configs/models/qwen3-omni-30b-a3b-speech-colocated.yaml", "1xH200-141GB")
    assert planned.plan.fits, planned.plan.errors
    spec = planned.spec
    seen = set()
    for process in planned.plan.nodes[0].processes:
        for placed in process.stages:
            if placed.stage not in ("thinker", "talker"):
                continue
            seen.add(placed.stage)
            stage = spec.stages[placed.stage]
            ctx = StageContext(placed.stage, spec, stage, REAL, "cuda:0",
                               placed.max_running_requests, kv_tokens=placed.kv_tokens,
                               memory_fraction=process.engine_fraction)  # fmt: skip
            args = _server_args(EngineSettings.of_stage(ctx))
            assert process.engine_fraction and 0 < process.engine_fraction < 1
            assert args.mem_fraction_static == process.engine_fraction
            assert args.max_total_tokens == placed.kv_tokens > 0
            assert args.context_length == stage.engine.context_length == 32768
            assert args.kv_cache_dtype == "auto"  # (bf16, the model's own)
    assert seen == {"thinker", "talker"}


def test_the_plan_refuses_what_sglang_cannot_hold() -> None:
    """A context past the checkpoint's trained positions, and a KV dtype SGLang does not keep
    (fp16 beside bf16 weights; fp8 on a CPU), are refused when the plan is made."""
    from planner.api import plan_spec
    from planner.errors import SpecError

    with pytest.raises(SpecError, match=r"context_length 70000 exceeds the 65536 positions"):
        plan_spec("configs/models/qwen3-omni-30b-a3b-text.yaml", "1xH200-141GB",
                  ["--thinker.engine.context_length", "70000"])  # fmt: skip
    with pytest.raises(SpecError, match=r"kv_dtype fp16: SGLang keeps the KV cache"):
        plan_spec("configs/models/qwen3-omni-30b-a3b-text.yaml", "1xH200-141GB",
                  ["--thinker.engine.kv_dtype", "fp16"])  # fmt: skip
    with pytest.raises(SpecError, match=r"kv_dtype fp8 needs a GPU"):
        plan_spec("configs/models/tiny-omni.yaml", "cpu", ["--thinker.engine.kv_dtype", "fp8"])
    fp8 = plan_spec("configs/models/qwen3-omni-30b-a3b-text.yaml", "1xH200-141GB",
                    ["--thinker.engine.kv_dtype", "fp8"])  # fmt: skip
    assert fp8.plan.fits
