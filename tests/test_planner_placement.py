"""Placement and the launch plan: the layouts of the issue, fleets, CPU hosts, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.api import plan_spec
from planner.errors import InventoryError
from planner.inventory import Inventory
from planner.plan import LaunchPlan

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "configs" / "models"
SPEECH = MODELS / "qwen3-omni-30b-a3b-speech.yaml"
COLOCATED = MODELS / "qwen3-omni-30b-a3b-speech-colocated.yaml"
TTS_17 = MODELS / "qwen3-tts-12hz-1.7b.yaml"
H100 = 85_520_809_984


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts in these tests come from real meta builds, never from planner.diskcache."""
    monkeypatch.setenv("OMNI_PLAN_CACHE", "off")


def procs(plan: LaunchPlan, node: int = 0) -> dict[str, object]:
    return {p.name: p for p in plan.nodes[node].processes}


def test_omni_speech_default_layout_fits_two_h100() -> None:
    result = plan_spec(SPEECH, "2xH100-80GB")
    plan = result.plan
    assert plan.fits and plan.errors == [] and plan.replicas == 1
    p = procs(plan)
    assert {n: p[n].gpus for n in p} == {
        "0/preprocessing": [], "0/image_encoder": [0], "0/audio_encoder": [0],
        "0/thinker": [0], "0/decode": [], "0/talker": [1], "0/code2wav": [0],
    }  # fmt: skip
    assert p["0/talker"].env == {"CUDA_VISIBLE_DEVICES": "1"}
    assert p["0/decode"].env == {"CUDA_VISIBLE_DEVICES": ""} and p["0/decode"].device == "cpu"
    thinker = p["0/thinker"].stages[0]
    assert thinker.params == 31_719_205_488 - 647_927_168 - 538_631_408
    assert thinker.memory.weights == thinker.params * 2
    assert thinker.kv_bytes_per_token == 98_304
    assert thinker.kv_tokens == 16 * 4096 and thinker.memory.kv_cache == 16 * 4096 * 98_304
    assert p["0/talker"].stages[0].memory.weights == 3_324_596_480 * 2
    gpu0, gpu1 = plan.nodes[0].gpus
    # Every weight of the checkpoint is on exactly one GPU.
    assert gpu0.planned.weights + gpu1.planned.weights == 35_259_818_545 * 2
    assert set(gpu1.by_stage) == {"0/talker"}
    for g in (gpu0, gpu1):
        assert g.capacity_bytes == H100
        assert g.planned.total == sum(b.total for b in g.by_stage.values())
        assert g.headroom_bytes >= g.reserved_bytes
    # the thinker's allocator may hold its whole footprint but the CUDA context
    thinker_process = p["0/thinker"]
    footprint = thinker_process.memory_per_gpu.total
    assert thinker_process.cuda_context_bytes == 512 << 20
    assert thinker_process.allocator_fraction == pytest.approx(
        (footprint - (512 << 20)) / H100, abs=1e-6
    )
    assert 0.7 < thinker_process.allocator_fraction < 0.85
    assert LaunchPlan.model_validate_json(plan.model_dump_json()) == plan  # JSON round trip


def test_colocated_layout_fits_one_h100_with_the_published_shares() -> None:
    plan = plan_spec(COLOCATED, "1xH100-80GB").plan
    assert plan.fits, plan.errors
    p = procs(plan)
    assert [s.stage for s in p["0/talker"].stages] == ["talker", "code2wav"]
    # each process's footprint is its shares and its runtime; its allocator holds all of it
    # but the CUDA context
    for name, shares in (("0/talker", (0.10, 0.02)), ("0/thinker", (0.78,))):
        process = p[name]
        runtime = process.memory_per_gpu.runtime
        assert process.memory_per_gpu.total == sum(int(x * H100) for x in shares) + runtime
        held = process.memory_per_gpu.total - process.cuda_context_bytes
        assert process.allocator_fraction == pytest.approx(held / H100, abs=1e-6)
    thinker = p["0/thinker"].stages[0]
    assert thinker.memory_share == 0.78
    # The KV cache is what the share leaves after weights and the activation estimate; the
    # share is accounted whole (what the pool leaves of it joins the activations)
    assert thinker.kv_tokens * 98_304 == thinker.memory.kv_cache
    assert thinker.memory.total == int(0.78 * H100)
    assert thinker.engine is not None and thinker.engine.sglang["max_total_tokens"] == (
        thinker.kv_tokens
    )
    (gpu,) = plan.nodes[0].gpus
    assert gpu.planned.total <= gpu.capacity_bytes - gpu.reserved_bytes


def test_engines_share_a_gpu_without_shares_each_with_its_planned_pool(tmp_path: Path) -> None:
    """Two engines of a replica on one GPU need no shares: each pool is the plan's (the worker
    sizes SGLang's pool from it, not from the GPU's free memory). Without shares the
    colocated spec's pools (8 x 32,768 tokens each) overflow one H100, and the error names the
    overflow and what would fix it; with smaller pools it fits."""
    raw = yaml.safe_load(COLOCATED.read_text())
    raw["model_dir"] = str((COLOCATED.parent / raw["model_dir"]).resolve())
    for stage in raw["stages"].values():
        stage.pop("memory_share", None)
    spec = tmp_path / "no-shares.yaml"
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    plan = plan_spec(spec, "1xH100-80GB").plan
    assert not plan.fits and plan.replicas == 0
    err = plan.errors[0]
    assert err.gpu == 0 and err.overflow_bytes > 0 and "overflow" in err.message
    assert any("kv_budget_tokens" in f or "max_running_requests" in f for f in err.fixes)
    budgets = ["--thinker.engine.kv_budget_tokens", "32768",
               "--talker.engine.kv_budget_tokens", "32768"]  # fmt: skip
    fits = plan_spec(spec, "1xH100-80GB", budgets).plan
    assert fits.fits, fits.errors
    p = procs(fits)
    assert p["0/thinker"].gpus == p["0/talker"].gpus == [0]
    assert p["0/thinker"].stages[0].kv_tokens == 32768


def test_shares_that_overflow_the_gpu_name_the_overflow() -> None:
    plan = plan_spec(COLOCATED, "1xH100-80GB", ["--talker.memory_share", "0.2"]).plan
    assert not plan.fits
    err = plan.errors[0]
    assert err.gpu == 0 and err.overflow_bytes > 0
    assert "overflow" in err.message and "H100-80GB" in err.message


def test_default_layout_on_one_gpu_names_the_missing_pin() -> None:
    plan = plan_spec(SPEECH, "1xH100-80GB").plan
    assert not plan.fits
    assert "pins GPU 1, but node node0 has 1 GPU(s)" in plan.errors[0].message


def test_not_fitting_names_gpu_overflow_and_fixes() -> None:
    plan = plan_spec(MODELS / "qwen3-8b.yaml", "1xL4-24GB").plan
    assert not plan.fits
    (err,) = plan.errors
    assert (err.node, err.gpu) == ("node0", 0)
    assert "L4-24GB" in err.message and f"overflow {err.overflow_bytes:,} B" in err.message
    fixes = " | ".join(err.fixes)
    assert "--llm.tp_size 2" in fixes
    assert "--llm.dtype fp8" in fixes
    assert "--llm.engine.max_running_requests" in fixes
    assert "another GPU: H100-80GB" in fixes or "another GPU: A100-80GB" in fixes
    # Following the running-requests fix makes it fit.
    n = next(f for f in err.fixes if "max_running_requests" in f).split()[4]
    fixed = plan_spec(
        MODELS / "qwen3-8b.yaml", "1xL4-24GB", [f"--llm.engine.max_running_requests={n}"]
    )
    assert fixed.plan.fits


def test_tensor_parallel_ranks_on_distinct_gpus_of_one_node() -> None:
    plan = plan_spec(
        MODELS / "qwen3-8b.yaml",
        "4xL4-24GB",
        ["--llm.tp_size", "2", "--llm.engine.max_running_requests", "8"],
    ).plan
    assert plan.fits
    llm = [p for p in plan.nodes[0].processes if p.group == "llm"]
    assert [p.gpus for p in llm] == [[0, 1], [2, 3]]  # two replicas of two ranks each
    assert llm[0].env["CUDA_VISIBLE_DEVICES"] == "0,1" and llm[0].tp_size == 2
    assert llm[0].memory_per_gpu.weights == 8_190_735_360  # half of the BF16 bytes per rank
    with pytest.raises(Exception, match="does not divide the 32 attention heads"):
        plan_spec(MODELS / "qwen3-8b.yaml", "4xL4-24GB", ["--llm.tp_size", "3"])


def test_tts_17b_gets_several_replicas_on_one_h100() -> None:
    plan = plan_spec(TTS_17, "1xH100-80GB").plan
    assert plan.fits and plan.replicas >= 4
    node = plan.nodes[0]
    assert all(r.gpus == [0] for r in node.replicas)
    engine = node.processes[0].stages[1]
    assert engine.params == 1_928_677_440 and engine.kv_bytes_per_token == 114_688
    # the vocoder in a process of its own beside the talker's, on the same GPU
    assert [p.name for p in node.processes[:2]] == ["0/tts", "0/vocoder"]
    (vocoder,) = node.processes[1].stages
    # FP32, the tokenizer's decoder only (its codebooks are parameters): the encoder that
    # makes a cloned voice's reference codes is preprocessing's, counted there
    assert vocoder.params == 114_323_137 and vocoder.memory.weights == 114_323_137 * 4
    (gpu,) = node.gpus
    assert gpu.planned.total <= gpu.capacity_bytes - gpu.reserved_bytes
    assert len(gpu.by_stage) == 2 * plan.replicas
    capped = plan_spec(TTS_17, "1xH100-80GB", max_replicas_per_node=2).plan
    assert capped.replicas == 2


def test_mixed_inventory_gets_a_fleet_plan() -> None:
    inv = ROOT / "configs" / "inventories" / "mixed-fleet.yaml"
    plan = plan_spec(TTS_17, inv).plan
    assert plan.fits
    names = [n.node for n in plan.nodes]
    assert names == ["h100-0", "h100-1", "l40s-0", "l40s-1", "l40s-2"]
    per_node = {n.node: len(n.replicas) for n in plan.nodes}
    assert per_node["h100-0"] == per_node["h100-1"] > per_node["l40s-0"] > 0
    f = plan.fleet
    assert (f.nodes, f.gpus, f.replicas) == (5, 2 * 8 + 3 * 4, sum(per_node.values()))
    assert f.replicas_by_gpu_type == {
        "8xH100-80GB": 2 * per_node["h100-0"],
        "4xL40S-48GB": 3 * per_node["l40s-0"],
    }
    assert f.planned.total == sum(g.planned.total for n in plan.nodes for g in n.gpus)
    # Omni speech: H100 nodes hold replicas; L40S nodes cannot (the thinker alone is 57 GiB)
    # and are reported as warnings, not as a refusal of the whole fleet.
    omni = plan_spec(SPEECH, inv).plan
    assert omni.fits and omni.replicas == 2 * 4
    assert len(omni.warnings) == 3
    assert all("holds no replica" in w.message and "L40S" in w.message for w in omni.warnings)


def test_cpu_only_host_plans_cpu_specs_and_refuses_gpu_stages() -> None:
    tiny = MODELS / "tiny-omni.yaml"
    plan = plan_spec(tiny).plan  # inventory=None: this host, no GPUs
    assert plan.fits and plan.replicas == 1
    assert all(
        p.device == "cpu" and p.env["CUDA_VISIBLE_DEVICES"] == "" for p in plan.nodes[0].processes
    )
    # device auto: the shipped specs run where the node's GPUs are, else on its CPU
    assert plan_spec(SPEECH).plan.fits
    # a stage the spec puts on a GPU is refused on a node without one, naming the fixes
    on_gpu = ["--thinker.device", "gpu", "--talker.device", "gpu"]
    plan = plan_spec(SPEECH, None, on_gpu).plan
    assert not plan.fits
    msg = plan.errors[0].message
    assert "has no GPUs, but stages thinker, talker run on gpu" in msg
    assert any("--gpus" in f for f in plan.errors[0].fixes)
    to_cpu = next(f for f in plan.errors[0].fixes if f.startswith("run on the CPU: "))
    assert "--thinker.device cpu" in to_cpu and "--thinker.gpus null" in to_cpu
    assert plan_spec(SPEECH, None, to_cpu.removeprefix("run on the CPU: ").split()).plan.fits


def test_bare_model_directory_plans_as_one_stage() -> None:
    plan = plan_spec(ROOT / "configs" / "hf" / "Qwen--Qwen3-ASR-0.6B", "1xL4-24GB").plan
    assert plan.fits
    stage = plan.nodes[0].processes[0].stages[0]
    assert (stage.stage, stage.params) == ("llm", 782_426_112)


@pytest.mark.parametrize(
    ("config_class", "trained"),
    [("LlamaConfig", 2048), ("Qwen2Config", 32_768), ("MistralConfig", 131_072),
     ("GPT2Config", 1024), ("GPTNeoXConfig", 2048)],
)  # fmt: skip
def test_a_bare_directory_plans_with_the_checkpoints_own_context(
    config_class: str, trained: int, tmp_path: Path
) -> None:
    """A transformers-default config of an architecture nobody here planned, saved as a bare
    model directory, plans on one H100 with its context the positions it was trained for: one
    trained for 2,048 (Llama's default, GPT-NeoX's) or 1,024 (GPT-2's) was refused against the
    generic spec's 4,096. Its KV pool is 16 requests of up to 4,096 tokens, and at least one
    whole context."""
    import transformers

    getattr(transformers, config_class)().save_pretrained(tmp_path)
    plan = plan_spec(tmp_path, "1xH100-80GB").plan
    assert plan.fits, plan.errors
    (stage,) = plan.nodes[0].processes[0].stages
    assert stage.engine is not None
    assert stage.engine.sglang["context_length"] == trained
    assert stage.kv_tokens == max(trained, 16 * min(trained, 4096))


def test_inventory_from_devices_maps_names_and_keeps_reported_bytes() -> None:
    inv = Inventory.from_devices(
        "gpu-host",
        [
            ("NVIDIA H100 80GB HBM3", H100),
            ("NVIDIA H100 80GB HBM3", 20 * 2**30),
            ("Mystery X", 7 * 2**30),
        ],
    )
    a, b, c = inv.nodes[0].gpus
    assert (a.name, a.memory_bytes) == ("H100-80GB", H100)
    assert b.memory_bytes == 20 * 2**30 and b.name.startswith("H100-80GB@")  # a MIG slice
    assert (c.name, c.memory_bytes) == ("GPU-7GiB", 7 * 2**30)
    assert plan_spec(MODELS / "qwen3-asr-0.6b.yaml", inv).plan.nodes[0].node == "gpu-host"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2xH100", r"unknown GPU type 'H100'.*did you mean 'H100-80GB'"),
        ("2xH100-80GB,x", "unknown GPU type 'x'"),
        ("0xL4-24GB", "at least 1"),
    ],
)
def test_bad_gpu_strings(text: str, message: str) -> None:
    with pytest.raises(InventoryError, match=message):
        Inventory.parse(text)


def test_bad_inventory_files(tmp_path: Path) -> None:
    bad = tmp_path / "inv.yaml"
    bad.write_text("nodes:\n  - {name: a, gpus: 2xH100-80GB, gpu: 1}\n")
    with pytest.raises(InventoryError, match=r"nodes\[0\]: unknown keys \['gpu'\]"):
        Inventory.from_file(bad)
    bad.write_text("nodes:\n  - {name: a, gpus: 1xL4-24GB}\n  - {name: a, gpus: 1xL4-24GB}\n")
    with pytest.raises(InventoryError, match="node name 'a' appears twice"):
        Inventory.from_file(bad)


def test_estimates_are_tunable_per_stage_and_per_catalog(tmp_path: Path) -> None:
    spec = MODELS / "qwen3-8b.yaml"
    base = plan_spec(spec, "1xH100-80GB", max_replicas_per_node=1).plan
    llm = procs(base)["0/llm"]
    tuned = plan_spec(
        spec,
        "1xH100-80GB",
        [
            "--llm.memory.activations_bytes", "1000",
            "--llm.memory.runtime_bytes", "2000",
            "--llm.engine.kv_budget_tokens", "10000",
            "--llm.engine.kv_dtype", "fp8",
            "--llm.dtype", "fp8",
        ],
        max_replicas_per_node=1,
    ).plan  # fmt: skip
    t = procs(tuned)["0/llm"]
    assert t.memory_per_gpu.activations == 1000 and t.memory_per_gpu.runtime == 2000
    assert t.memory_per_gpu.weights == llm.memory_per_gpu.weights // 2 == 8_190_735_360
    assert t.stages[0].kv_tokens == 10_000
    assert t.memory_per_gpu.kv_cache == 10_000 * 147_456 // 2
    # A catalog of one's own: capacity, reserve and runtime per GPU type.
    catalog = tmp_path / "gpus.yaml"
    catalog.write_text(
        "defaults: {runtime_bytes_per_process: 1073741824, cuda_graph_bytes: 0}\n"
        "gpus:\n  Big-1TB: {memory_bytes: 1099511627776, reserved_bytes: 0}\n"
    )
    inv = tmp_path / "inv.yaml"
    inv.write_text("catalog: gpus.yaml\nnodes:\n  - {name: big, gpus: 1xBig-1TB}\n")
    plan = plan_spec(spec, inv, max_replicas_per_node=1).plan
    (gpu,) = plan.nodes[0].gpus
    assert (gpu.name, gpu.capacity_bytes, gpu.reserved_bytes) == ("Big-1TB", 2**40, 0)
    assert procs(plan)["0/llm"].memory_per_gpu.runtime == 2**30


def test_following_the_tp_fix_of_a_pinned_layout_makes_it_fit() -> None:
    plan = plan_spec(SPEECH, "4xL40S-48GB").plan
    assert not plan.fits
    fix = next(f for f in plan.errors[0].fixes if f.startswith("more TP:"))
    overrides = fix.removeprefix("more TP:").split("(")[0].split()
    assert overrides == ["--thinker.tp_size", "2", "--thinker.gpus", "[0,2]"]
    fixed = plan_spec(SPEECH, "4xL40S-48GB", overrides).plan
    assert fixed.fits
    assert procs(fixed)["0/thinker"].env["CUDA_VISIBLE_DEVICES"] == "0,2"


# spec -> its autoregressive stage
_SPECS = {
    "qwen3-8b.yaml": "llm",
    "qwen3-tts-12hz-0.6b.yaml": "tts_engine",
    "qwen3-asr-0.6b.yaml": "asr",
    "qwen3-omni-30b-a3b-text.yaml": "thinker",
}
_GPUS = ["H100-80GB", "L4-24GB", "L40S-48GB", "A100-40GB", "H200-141GB"]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=st.sampled_from(sorted(_SPECS)),
    gpus=st.lists(st.sampled_from(_GPUS), min_size=1, max_size=4),
    tp=st.sampled_from([1, 2]),
    running=st.integers(min_value=1, max_value=64),
)
def test_placement_invariants(spec: str, gpus: list[str], tp: int, running: int) -> None:
    stage = _SPECS[spec]
    overrides = [f"--{stage}.engine.max_running_requests", str(running)]
    if spec == "qwen3-8b.yaml":
        overrides += ["--llm.tp_size", str(tp)]
    text = ",".join(f"1x{g}" for g in gpus)
    plan = plan_spec(MODELS / spec, text, overrides).plan
    assert plan == plan_spec(MODELS / spec, text, overrides).plan  # deterministic
    node = plan.nodes[0]
    assert plan.fits == (len(node.replicas) > 0)
    for g in node.gpus:
        assert g.planned.total == sum(b.total for b in g.by_stage.values())
        assert g.planned.total <= g.capacity_bytes - g.reserved_bytes
    for p in node.processes:
        if p.device == "gpu":
            assert len(p.gpus) == len(set(p.gpus)) == p.tp_size
            assert p.env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, p.gpus))
    if not plan.fits:
        assert plan.errors and all(e.message for e in plan.errors)


def test_automatic_placement_keeps_streaming_neighbours_together() -> None:
    unpin = []
    for stage in ("image_encoder", "audio_encoder", "thinker", "talker", "code2wav"):
        unpin += [f"--{stage}.gpus", "null"]
    plan = plan_spec(SPEECH, "2xH100-80GB", unpin).plan
    assert plan.fits and plan.replicas == 2  # denser than the pinned layout's one replica
    p = procs(plan)
    assert p["0/code2wav"].gpus == p["0/talker"].gpus  # the talker streams to code2wav
    # engines may share a GPU, each with its planned pool: the whole replica on one H200
    one = plan_spec(SPEECH, "1xH200-141GB", unpin).plan
    assert one.fits and one.replicas == 1
    q = procs(one)
    assert q["0/thinker"].gpus == q["0/talker"].gpus == [0]


@pytest.mark.parametrize("spec", sorted(p.name for p in MODELS.glob("*.yaml")))
def test_every_shipped_spec_runs_on_the_gpus_of_a_node_and_on_a_cpu_without(spec: str) -> None:
    """``device: auto`` and ``dtype: auto``: on one H100 (two for the default Omni layout,
    which pins its talker to a second GPU) every autoregressive stage is on a GPU in bf16 with
    FlashAttention 3; on a node without GPUs the same spec runs on the CPU in fp32."""
    gpus = "2xH100-80GB" if spec == "qwen3-omni-30b-a3b-speech.yaml" else "1xH100-80GB"
    on_gpus = plan_spec(MODELS / spec, gpus).plan
    assert on_gpus.fits, on_gpus.errors
    engines = [(p, s) for p in on_gpus.nodes[0].processes for s in p.stages if s.engine]
    assert engines
    for p, s in engines:
        assert p.device == "gpu" and s.dtype == "bf16", (p.name, s.stage)
        assert s.engine is not None and s.engine.attention_backend == "fa3"
        assert s.engine.sglang["device"] == "cuda" and s.engine.sglang["dtype"] == "bfloat16"
    on_cpu = plan_spec(MODELS / spec).plan
    assert on_cpu.fits, on_cpu.errors
    for p in on_cpu.nodes[0].processes:
        assert p.device == "cpu" and not p.gpus
        for s in p.stages:
            if s.engine is not None:
                assert s.dtype == "fp32" and s.engine.attention_backend == "torch_native"
