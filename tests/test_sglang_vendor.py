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


@pytest.mark.parametrize(
    ("spec", "gpus"),
    [("qwen3-omni-30b-a3b-speech-colocated.yaml", "1xH200-141GB"),
     ("qwen3-omni-30b-a3b-speech.yaml", "2xH100-80GB"),
     ("tiny-omni.yaml", "1xH100-80GB")],
)  # fmt: skip
def test_sglang_starts_with_the_arguments_the_plan_shows(spec: str, gpus: str) -> None:
    """Each SGLang engine's server arguments are the plan's (``omni-plan`` shows them:
    planner.engine_plan), plus only what a run decides (the model's path and load format):
    the plan's KV pool in tokens, the dtype auto resolved to bf16 on a GPU, the GPU's
    attention backend, SGLang's own meaning of ``mem_fraction_static``, no prefill graphs."""
    from planner.api import plan_spec
    from worker.contract.stage_context import StageContext
    from worker.engines import sglang as vendor
    from worker.engines.sglang.engine import EngineSettings, _server_args

    vendor.load()
    planned = plan_spec(f"configs/models/{spec}", gpus)
    assert planned.plan.fits, planned.plan.errors
    seen = set()
    for process in planned.plan.nodes[0].processes:
        if process.replica:
            continue
        for placed in process.stages:
            if placed.engine is None:
                continue
            seen.add(placed.stage)
            stage = planned.spec.stages[placed.stage]
            ctx = StageContext(placed.stage, planned.spec, stage, REAL, "cuda:0",
                               placed.max_running_requests, kv_tokens=placed.kv_tokens,
                               engine=placed.engine)  # fmt: skip
            args = _server_args(EngineSettings.of_stage(ctx))
            for name, value in placed.engine.sglang.items():
                assert getattr(args, name) == value, name
            assert args.model_path == str(REAL) and args.load_format == "auto"
            assert args.dtype == "bfloat16" and placed.dtype == "bf16"
            assert args.max_total_tokens == placed.kv_tokens > 0
            assert args.attention_backend == placed.engine.attention_backend == "fa3"
            assert args.disable_prefill_cuda_graph
            weights, kv = placed.memory.weights, placed.engine.kv_bytes
            gpu = planned.plan.nodes[0].gpus[process.gpus[0]]
            share = (weights + kv) / gpu.capacity_bytes
            assert args.mem_fraction_static == pytest.approx(share, abs=1e-6)
            talker = stage.engine.prompt == "embeddings"
            assert args.disable_radix_cache == args.disable_cuda_graph == talker
    assert seen == {"thinker", "talker"}


def test_an_fp32_engine_on_a_gpu_gets_an_attention_backend_that_computes_fp32() -> None:
    """FlashAttention 3 (what SGLang picks on Hopper) takes fp16, bf16 or fp8 only: an engine
    kept in fp32 on a GPU is planned onto SGLang's triton kernels, and the plan says so."""
    from planner.api import plan_spec

    planned = plan_spec("configs/models/tiny-omni.yaml", "1xH100-80GB",
                        ["--thinker.dtype", "fp32"])  # fmt: skip
    placed = {s.stage: s for p in planned.plan.nodes[0].processes if not p.replica
              for s in p.stages}  # fmt: skip
    assert placed["thinker"].dtype == "fp32"
    assert placed["thinker"].engine.attention_backend == "triton"
    assert placed["thinker"].engine.sglang["dtype"] == "float32"
    assert placed["talker"].engine.attention_backend == "fa3"  # (bf16: auto on a GPU)


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
