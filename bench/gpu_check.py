"""The GPU check: what a GPU host needs of omni-fleet, phase by phase, PASS or FAIL each.

(a) env        the GPU, its driver, torch and CUDA, the free memory; what is importable.
(b) handshake  the shipped layouts on this GPU at real size: their stage processes started
               together through the worker's own launcher (``HostConfig.of_process``,
               ``StageProcess``, the host's allocator cap), each holding what the plan gives it
               with real CUDA allocations and random weights (``bench/gpu_probe``: the check of
               free memory before each KV pool is the worker's own); every pool the plan's,
               every process within its footprint (the driver's count, CUDA context included),
               the GPU holding them all.
(c) stages     the stages that are not SGLang's at real size with seeded random weights, on the
               GPU in their planned dtype against the same stage in fp32 on the CPU: both
               encoders, both vocoders (streamed, as they serve), both code predictors; their
               step times and host synchronisations per step.
(d) sglang     SGLang's own CUDA path when SGLang is importable: tiny-omni's thinker in bf16
               and Qwen3-ASR 0.6B with random weights, time to first token and tokens/s at
               concurrency 1 and 32 (skipped where SGLang is not installed).

Run on a GPU host (the GPU lock installed) or on a bare GPU machine (torch, triton and
transformers installed, no SGLang, no network):

    bench/gpu_bundle.sh                      # once, where pip reaches PyPI: .gpu-bundle/
    # on the GPU machine, in the repository (the bundle travels with it):
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-bundle/*.whl
    PYTHONPATH=/tmp/site:. python3 bench/gpu_check.py

    python3 bench/gpu_check.py --dry-run     # without a GPU: every phase on the CPU, small

A dry run runs the same code on the CPU: the plans of the GPU named by ``--gpu`` (H100-80GB),
the probe processes through the launcher holding 1/4096 of their bytes, the stages of the tiny
checkpoints in fp32 against bf16, SGLang's CPU path. docs/omni-worker.md has the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import queue
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
MODELS = REPO / "configs" / "models"
GIB = 1 << 30
PHASES = ("env", "handshake", "stages", "sglang")
# the layouts phase (b) starts on GPU 0 (a spec that pins a second GPU: its processes on the
# first)
LAYOUTS = (
    "qwen3-omni-30b-a3b-speech-colocated.yaml",
    "qwen3-omni-30b-a3b-speech.yaml",
    "qwen3-tts-12hz-1.7b.yaml",
    "qwen3-asr-0.6b.yaml",
)
DRY_SCALE = 1 / 4096


class Check:
    """One phase's verdict and what it measured."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self.failures: list[str] = []
        self.skipped = ""

    def say(self, line: str) -> None:
        self.lines.append(line)
        print(f"  {line}", flush=True)

    def fail(self, why: str) -> None:
        self.failures.append(why)
        print(f"  FAIL: {why}", flush=True)

    @property
    def verdict(self) -> str:
        return "SKIP" if self.skipped else "FAIL" if self.failures else "PASS"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    ap.add_argument("--dry-run", action="store_true", help="on the CPU, small (no GPU needed)")
    ap.add_argument("--gpu", default=None, help="the GPU type to plan for (default: detected)")
    ap.add_argument("--json", type=Path, default=None, help="write the verdicts here")
    ap.add_argument("--sglang-one", default=None, help=argparse.SUPPRESS)  # (phase d's child)
    args = ap.parse_args()
    if args.sglang_one:
        return _sglang_one(args.sglang_one, args.dry_run)
    import torch

    cuda = torch.cuda.is_available() and not args.dry_run
    device = "cuda:0" if cuda else "cpu"
    print(f"omni-fleet GPU check: {'on ' + device if cuda else 'dry run on the CPU'}", flush=True)
    checks = []
    for phase in args.phases:
        print(f"\n== ({'abcd'[PHASES.index(phase)]}) {phase}", flush=True)
        check = Check(phase)
        t0 = time.perf_counter()
        try:
            {"env": _env, "handshake": _handshake, "stages": _stages, "sglang": _sglang}[phase](
                check, cuda, args
            )
        except Exception:
            check.fail(traceback.format_exc().strip().splitlines()[-1])
            traceback.print_exc()
        print(f"-- {phase}: {check.verdict}{f' ({check.skipped})' if check.skipped else ''} "
              f"in {time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
        checks.append(check)
    print("\n" + "\n".join(f"{c.verdict}  ({'abcd'[PHASES.index(c.name)]}) {c.name}"
                           for c in checks))  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps([c.__dict__ | {"verdict": c.verdict} for c in checks]))
    return 1 if any(c.verdict == "FAIL" for c in checks) else 0


# ---- (a) the environment ------------------------------------------------------------------


def _env(check: Check, cuda: bool, args: argparse.Namespace) -> None:
    import torch

    from worker import gpus

    sglang = _version("sglang") or "not installed"
    check.say(
        f"python {platform.python_version()}, torch {torch.__version__} (CUDA "
        f"{torch.version.cuda}), triton {_version('triton')}, transformers "
        f"{_version('transformers')}, SGLang {sglang}"
    )
    found, method = gpus.detect()
    driver = gpus._driver()
    check.say(f"GPUs ({method}): {found or 'none'}; driver {driver[0]} (CUDA {driver[1]})")
    if not cuda:
        check.skipped = "dry run: no GPU used"
        return
    free, total = torch.cuda.mem_get_info(0)
    name = torch.cuda.get_device_name(0)
    check.say(f"{name}: {free / GIB:.2f} of {total / GIB:.2f} GiB free")
    problem = gpus.cuda_problem(1)
    if problem:
        check.fail(problem)


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _gpu_type(cuda: bool, args: argparse.Namespace) -> str:
    """The catalog name of the GPU the layouts are planned for."""
    from planner.catalog import load_catalog
    from worker import gpus

    if args.gpu:
        return args.gpu
    found, _ = gpus.detect() if cuda else ([], "none")
    if not found:
        return "H100-80GB"
    return load_catalog().match_device(*found[0]).name


# ---- (b) the memory handshake with real processes ---------------------------------------------


def _handshake(check: Check, cuda: bool, args: argparse.Namespace) -> None:
    from planner.api import plan_spec

    gpu_type = _gpu_type(cuda, args)
    for spec in LAYOUTS:
        planned = plan_spec(MODELS / spec, f"1x{gpu_type}")
        if not planned.plan.fits:  # (two GPUs only where the spec needs them)
            planned = plan_spec(MODELS / spec, f"2x{gpu_type}")
        if not planned.plan.fits:
            check.fail(f"{spec} on {gpu_type}: {planned.plan.errors[0].message}")
            continue
        node = planned.plan.nodes[0]
        on_gpu0 = [p for p in node.processes if 0 in p.gpus]
        label = f"{spec} ({len(on_gpu0)} processes on GPU 0 of {len(node.gpus)}x{gpu_type})"
        _hold_layout(check, label, planned, on_gpu0, cuda)


def _hold_layout(check: Check, label: str, planned: Any, processes: list, cuda: bool) -> None:
    """Every process of the layout on GPU 0 started together through the worker's launcher,
    each stage holding what the plan gives it (bench/gpu_probe); then their reports read."""
    import dataclasses

    from bench import gpu_probe
    from worker.runtime.host import HostConfig
    from worker.runtime.process import StageProcess
    from worker.stages import messages as m

    node = planned.plan.nodes[0]
    probe: dict[str, Any] = {"scale": 1.0 if cuda else DRY_SCALE, "dry_run": not cuda,
                             "stages": {}, "groups": {}}  # fmt: skip
    for p in processes:
        probe["groups"][p.group] = {"runtime": p.memory_per_gpu.runtime,
                                    "context": p.cuda_context_bytes}  # fmt: skip
        for s in p.stages:
            probe["stages"][s.stage] = {"weights": s.memory.weights,
                                        "activations": s.memory.activations}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpu-check-probe-") as tmp:
        checkpoint = gpu_probe.write_checkpoint(Path(tmp), probe)
        inbox: queue.Queue = queue.Queue()
        procs = []
        t0 = time.perf_counter()
        for p in processes:
            cfg = HostConfig.of_process(p, node, planned.spec.model_dump_json(), str(checkpoint),
                                        threads=1, shm_prefix=f"gpucheck{os.getpid()}",
                                        families=("bench.gpu_probe",))  # fmt: skip
            if not cuda:  # (the launcher's path on the CPU: no cap, nothing held on a GPU)
                cfg = dataclasses.replace(cfg, device="cpu", budget=None)
            procs.append(StageProcess(cfg, *_reporters(inbox, p.name)))
        ready: dict[str, set[str]] = {p.name: set() for p in processes}
        want = {p.name: {s.stage for s in p.stages} for p in processes}
        fatal = []
        deadline = time.monotonic() + 240
        while any(ready[n] != want[n] for n in ready) and not fatal:
            try:
                name, msgs = inbox.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                fatal.append("not ready after 240 s")
                break
            for msg in msgs:
                if msg[0] == m.READY:
                    ready[name].add(msg[1])
                elif msg[0] == m.FATAL:
                    fatal.append(f"{name}: {msg[1].strip().splitlines()[-1]}")
                elif msg[0] == "exit":
                    fatal.append(f"{name} exited with {msg[1]}")
        took = time.perf_counter() - t0
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.send((m.STOP,))
                proc.flush()
        for proc in procs:
            proc.stop()
        if fatal:
            check.fail(f"{label}: " + "; ".join(fatal))
            return
        held = [json.loads(f.read_text()) for f in (checkpoint / "held").glob("*.json")]
    _verdict(check, label, processes, node, held, took, cuda)


def _reporters(inbox: queue.Queue, name: str) -> tuple[Callable, Callable]:
    """A stage process's callbacks (its messages, its exit), into ``inbox`` with its name."""
    return (lambda msgs: inbox.put((name, msgs)), lambda code: inbox.put((name, [("exit", code)])))


def _verdict(check: Check, label: str, processes: list, node: Any, held: list, took: float,
             cuda: bool) -> None:  # fmt: skip
    """Each engine's pool the plan's; each process within its footprint; the GPU holds all."""
    check.say(f"{label}: every stage ready in {took:.1f} s")
    by_group: dict[str, list[dict]] = {}
    for h in held:
        by_group.setdefault(h["group"], []).append(h)
    gpu = node.gpus[0]
    total = 0
    for p in processes:
        footprint = p.memory_per_gpu.total
        reports = by_group.get(p.group, [])
        for s in p.stages:
            if s.engine is not None:
                pools = {r["kv_tokens"] for r in reports if r["stage"] == s.stage}
                if pools != {s.kv_tokens}:
                    check.fail(f"{p.name} {s.stage}: pools {pools}, the plan's {s.kv_tokens}")
        if not cuda:
            continue
        # one report per stage and pid; a replica's processes share the group's name
        for pid in {r["pid"] for r in reports}:
            mine = [r for r in reports if r["pid"] == pid]
            used = max((r["driver_used"] or 0) for r in mine)
            reserved = max(r["reserved_peak"] for r in mine)
            total += used or reserved + p.cuda_context_bytes
            context = used - reserved if used else None
            check.say(
                f"  {p.name:<16} footprint {footprint / GIB:6.2f} GiB: allocator peak "
                f"{reserved / GIB:6.2f}, driver's count {used / GIB if used else float('nan'):6.2f}"
                f" (CUDA context {context / GIB if context else float('nan'):.2f}, planned "
                f"{p.cuda_context_bytes / GIB:.2f})"
            )
            if used and used > footprint:
                check.fail(f"{p.name} (pid {pid}) holds {used / GIB:.2f} GiB, past its "
                           f"footprint {footprint / GIB:.2f}")  # fmt: skip
    if cuda and total > gpu.capacity_bytes:
        check.fail(f"{label}: {total / GIB:.2f} GiB held, past the GPU's {gpu.capacity_bytes}")


# ---- (c) the stages that are not SGLang's ---------------------------------------------------

# (name, spec at real size, tiny spec for a dry run, stage)
STAGES = (
    ("Qwen3-Omni audio encoder", "qwen3-omni-30b-a3b-speech.yaml", "tiny-omni.yaml",
     "audio_encoder"),
    ("Qwen3-Omni vision encoder", "qwen3-omni-30b-a3b-speech.yaml", "tiny-omni.yaml",
     "image_encoder"),
    ("Qwen3-Omni code2wav", "qwen3-omni-30b-a3b-speech.yaml", "tiny-omni.yaml", "code2wav"),
    ("Qwen3-TTS vocoder", "qwen3-tts-12hz-1.7b.yaml", "tiny-qwen3-tts.yaml", "vocoder"),
)  # fmt: skip
SNR_DB = {"bf16": 20.0, "fp32": 40.0}  # the least a GPU's audio may differ from the CPU's
REL_ERR = {"bf16": 0.05, "fp32": 1e-3}  # the most a GPU's embeddings / logits may differ


def _stages(check: Check, cuda: bool, args: argparse.Namespace) -> None:
    import torch

    device = "cuda:0" if cuda else "cpu"
    for name, real, tiny, stage in STAGES:
        spec_path = MODELS / (real if cuda else tiny)
        ref = _executor(spec_path, stage, "cpu", cuda)
        run = _executor(spec_path, stage, device, cuda, dtype=None if cuda else "bf16")
        dtype = str(run.ctx.dtype)
        if stage.endswith("encoder"):
            got, want, times, syncs = _encode_both(ref, run, stage, cuda)
            err = float((got.float() - want.float()).norm() / want.float().norm())
            verdict = err <= REL_ERR[dtype]
            what = f"relative error {err:.2e} (at most {REL_ERR[dtype]:.0e})"
        else:
            got, want, times, syncs = _vocode_both(ref, run, 120 if cuda else 40)
            snr = _snr(want, got)
            verdict = snr >= SNR_DB[dtype]
            what = f"SNR {snr:.1f} dB against the CPU's fp32 (at least {SNR_DB[dtype]:.0f})"
        check.say(f"{name} ({stage}, {dtype} on {device}): {what}; step "
                  f"{np.median(times) * 1000:.2f} ms median over {len(times)}, "
                  f"{np.mean(syncs):.1f} host synchronisations a step")  # fmt: skip
        if not verdict:
            check.fail(f"{name}: {what}")
        del ref, run
        if cuda:
            torch.cuda.empty_cache()
    _code_predictors(check, device, cuda)


def _executor(
    spec_path: Path,
    stage: str,
    device: str,
    real: bool,
    dtype: str | None = None,
    tokenizer_from: Path | None = None,
):
    """A stage's executor on ``device`` with the seeded random weights (the same on every
    device), in the spec's dtype there (``dtype`` to force one). The real configs come without
    a tokenizer: ``tokenizer_from`` (a tiny spec) lends its checkpoint's."""
    from planner.loader import load_spec
    from worker.contract.stage_context import StageContext
    from worker.models.checkpoint import resolve_checkpoint
    from worker.models.registry import make_executor

    spec = load_spec(spec_path).spec
    st = spec.stages[stage].model_copy(deep=True)
    st.engine.encoder_cache_bytes = 0
    if dtype:
        st.dtype = dtype
    cache = Path(tempfile.gettempdir()) / "omni-gpu-check-cache"
    if real:
        checkpoint = (spec_path.parent / spec.model_dir).resolve()
        if tokenizer_from is not None:
            tiny = load_spec(tokenizer_from).spec
            lender = resolve_checkpoint(tiny, tokenizer_from, cache, log=lambda _m: None)
            checkpoint = _with_tokenizer(checkpoint, lender)
    else:
        checkpoint = resolve_checkpoint(spec, spec_path, cache, log=lambda _m: None)
    ctx = StageContext(stage, spec, st, checkpoint, device, 8, extra={"random_weights": True})
    ex = make_executor(ctx)
    ex.load()
    return ex


def _with_tokenizer(real: Path, tiny: Path) -> Path:
    """A copy of a real config folder with a tiny checkpoint's tokenizer files, the text token
    ids the tiny config names set to the tiny tokenizer's; no weights (the stage draws them)."""
    import shutil

    out = Path(tempfile.mkdtemp(prefix=f"gpu-check-{real.name}-"))
    shutil.copytree(real, out, dirs_exist_ok=True)
    for f in tiny.iterdir():
        if f.is_file() and f.name.startswith(("tokenizer", "chat_template", "special_tokens",
                                               "vocab", "merges")):  # fmt: skip
            shutil.copyfile(f, out / f.name)
    config = json.loads((out / "config.json").read_text())
    small = json.loads((tiny / "config.json").read_text())
    for key in ("", "thinker_config"):
        src, dst = (small.get(key, {}), config.get(key, {})) if key else (small, config)
        for k, v in src.items():
            if k.endswith("_token_id") and isinstance(v, int) and k in dst:
                dst[k] = v
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def _timed_steps(ex, cuda: bool, until: Callable[[list], bool]) -> tuple[list, list, list]:
    """Steps ``ex`` until ``until(outputs)``: the outputs, each step's time and its host
    synchronisations (torch's sync debug mode warns at each)."""
    import torch

    outs, times, syncs = [], [], []
    while not until(outs):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            t0 = time.perf_counter()
            got = ex.step()
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode(0)
            dt = time.perf_counter() - t0
        if got:
            outs += got
            times.append(dt)
            syncs.append(sum("synchroniz" in str(w.message) for w in seen))
        else:
            time.sleep(0.002)
    return outs, times, syncs


def _encode_both(ref, run, stage: str, cuda: bool):
    from worker.models.qwen3_omni.payloads import OmniPrompt
    from worker.stages.base import FINAL, RequestMeta

    rng = np.random.default_rng(0)
    if stage == "audio_encoder":
        mels = ref.config.thinker_config.audio_config.num_mel_bins
        frames = 3000 if cuda else 300  # (30 s of audio)
        x = rng.standard_normal((mels, frames), dtype=np.float32)
        payload, key = OmniPrompt([], audio_features=x, audio_lens=[frames]), "audio"
    else:
        cfg = ref.config.thinker_config.vision_config
        dim = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
        side = 2 * cfg.spatial_merge_size * (8 if cuda else 1)
        grid = np.array([[1, side, side]], dtype=np.int64)
        pixels = rng.standard_normal((int(grid.prod()), dim), dtype=np.float32)
        payload, key = OmniPrompt([], pixel_values=pixels, image_grid=grid), "image"
    got = {}
    times: list[float] = []
    syncs: list[int] = []
    for ex, on in ((ref, False), (run, cuda)):
        for i in range(3):  # (the first warms up; the last two are timed)
            ex.start(f"r{i}", RequestMeta("chat", frozenset({"text"})), {"preprocessing": payload})
            outs, t, s = _timed_steps(ex, on, lambda o: any(k == FINAL for k, *_ in o))
            if ex is run and i:
                times += t
                syncs += s
        got[ex is run] = getattr(next(d for k, _, d in outs if k == FINAL), key).cpu()
    return got[True], got[False], times, syncs


def _vocode_both(ref, run, frames: int):
    """The same codes streamed through both vocoders a few frames at a time, as a talker
    feeds them: the CPU's PCM, the GPU's, and the GPU's steps."""
    from worker.stages.base import DONE, OUT, RequestMeta
    from worker.stages.payloads import CodeFrames

    groups, size = _code_shape(ref)
    codes = np.random.default_rng(1).integers(0, size, (frames, groups)).astype(np.int64)
    pcm = {}
    times: list[float] = []
    syncs: list[int] = []
    for ex in (ref, run):
        ex.start("r", RequestMeta("speech", frozenset({"audio"})), {})
        for at in range(0, frames, 4):
            ex.feed("r", "talker", CodeFrames(codes[at : at + 4]))
        ex.end_stream("r", "talker", {})
        cuda = ex.ctx.device.startswith("cuda")
        outs, t, s = _timed_steps(ex, cuda, lambda o: any(k == DONE for k, *_ in o))
        pcm[ex is run] = np.concatenate([d[1] for k, _, d in outs if k == OUT])
        if ex is run:
            times, syncs = t, s
    return pcm[True], pcm[False], times, syncs


def _code_shape(ex) -> tuple[int, int]:
    """(code groups, codebook size) of a vocoder executor's model."""
    model = getattr(ex, "model", None)
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "num_quantizers"):  # Qwen3-Omni's code2wav
        return int(cfg.num_quantizers), int(cfg.codebook_size)
    dec = ex.ctx.checkpoint / ex.ctx.stage.component.config_dir / "config.json"
    d = json.loads(dec.read_text())["decoder_config"]
    return int(d["num_quantizers"]), int(d["codebook_size"])


def _snr(reference: np.ndarray, got: np.ndarray) -> float:
    a = reference.astype(np.float64)
    b = got.astype(np.float64)
    n = min(len(a), len(b))
    noise = np.sum((a[:n] - b[:n]) ** 2)
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(a[:n] ** 2) / noise))


def _code_predictors(check: Check, device: str, cuda: bool) -> None:
    """The talkers' code predictors (a frame's groups after its first, one pass each): Qwen3-
    TTS's (``CodePredictor.predict``) and Qwen3-Omni's (its talker's ``residual_codes``), in bf16
    on the device against fp32 on the CPU: the first pass's logits, then a frame's time and host
    synchronisations, for 16 rows at once."""
    import torch

    for name, build in (("Qwen3-TTS", _tts_predictor), ("Qwen3-Omni", _omni_predictor)):
        results = []
        for on, dt in (("cpu", torch.float32), (device, torch.bfloat16)):
            first_logits, frame = build(cuda, on, dt)
            with torch.inference_mode():
                logits = first_logits().float().cpu()
                times, syncs = _timed(frame, on, 4)
            results.append((logits, times[1:], syncs[1:]))
        (want, _, _), (got, times, syncs) = results
        err = float((got - want).norm() / want.norm())
        what = f"first pass's logits: relative error {err:.2e} (at most {REL_ERR['bf16']:.0e})"
        check.say(f"{name} code predictor (16 rows, bf16 on {device}): {what}; a frame "
                  f"{np.median(times) * 1000:.2f} ms, {np.mean(syncs):.1f} host "
                  "synchronisations")  # fmt: skip
        if err > REL_ERR["bf16"]:
            check.fail(f"{name} code predictor: {what}")


def _timed(run: Callable[[], Any], device: str, n: int) -> tuple[list[float], list[int]]:
    import torch

    cuda = device.startswith("cuda")
    times, syncs = [], []
    for _ in range(n):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            t0 = time.perf_counter()
            run()
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.set_sync_debug_mode(0)
            times.append(time.perf_counter() - t0)
            syncs.append(sum("synchroniz" in str(w.message) for w in seen))
    return times, syncs


def _inputs(width: int, device: str, dtype: Any, rows: int = 16) -> tuple[Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(2)
    return tuple(
        (torch.randn(rows, 1, width, generator=gen) * 0.5).to(device, dtype) for _ in range(2)
    )


def _tts_predictor(real: bool, device: str, dtype: Any) -> tuple[Callable, Callable]:
    import torch

    from worker.layers.module_weights import random_into
    from worker.models.qwen3_tts.modeling import CodePredictor

    folder = "Qwen--Qwen3-TTS-12Hz-1.7B-Base" if real else "tiny-qwen3-tts-custom-voice"
    tc = json.loads((MODELS.parent / "hf" / folder / "config.json").read_text())["talker_config"]
    with torch.device("meta"):
        cp = CodePredictor(tc["code_predictor_config"], tc["hidden_size"])
    random_into(cp, device=device, dtype=dtype)
    cp.eval()
    hidden, first = _inputs(tc["hidden_size"], device, dtype)

    def first_logits() -> Any:
        return cp.lm_head[0](cp._proj(torch.cat([hidden, first], dim=1))[:, -1])

    return first_logits, lambda: cp.predict(hidden, first)


def _omni_predictor(real: bool, device: str, dtype: Any) -> tuple[Callable, Callable]:
    import types

    import torch

    from planner.spec import ComponentSpec
    from worker.contract.sampling import SamplerState, Sampling
    from worker.layers.stage_weights import random_stage_module
    from worker.models.qwen3_omni.talker_sglang import residual_codes

    folder = MODELS.parent / "hf" / ("Qwen--Qwen3-Omni-30B-A3B-Instruct" if real else "tiny-omni")
    name = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    predictor, _ = random_stage_module(folder, ComponentSpec(module="talker.code_predictor"),
                                       name, device)  # fmt: skip
    embed, _ = random_stage_module(folder, ComponentSpec(module="talker.model.codec_embedding"),
                                   name, device)  # fmt: skip
    tc = json.loads((folder / "config.json").read_text())["talker_config"]
    talker = types.SimpleNamespace(
        code_predictor=predictor,
        config=types.SimpleNamespace(num_code_groups=tc.get("num_code_groups", 16)),
    )
    width = embed.weight.shape[1]
    past, _ = _inputs(width, device, dtype)
    first = torch.arange(16, device=device)[:, None] % embed.weight.shape[0]
    rows = [types.SimpleNamespace(rest_picks=SamplerState.of(Sampling(temperature=0.0), []))
            for _ in range(16)]  # fmt: skip

    def first_logits() -> Any:
        out = predictor.model(inputs_embeds=torch.cat([past, embed(first)], dim=1))
        return predictor.lm_head[0](out.last_hidden_state[:, -1])

    return first_logits, lambda: residual_codes(talker, embed, past, first, rows)


# ---- (d) SGLang's CUDA path -------------------------------------------------------------------


def _sglang(check: Check, cuda: bool, args: argparse.Namespace) -> None:
    if importlib.util.find_spec("sglang") is None:
        check.skipped = "SGLang is not installed here"
        return
    for model in ("omni", "asr"):
        cmd = [
            sys.executable,
            __file__,
            "--sglang-one",
            model,
            *(["--dry-run"] if not cuda else []),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=REPO)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
        for ln in lines:
            check.say(ln.removeprefix("RESULT "))
        if out.returncode or not lines:
            check.fail(f"{model}: exit {out.returncode}: {out.stderr.strip().splitlines()[-3:]}")


def _sglang_one(model: str, dry: bool) -> int:
    """One engine in a process of its own (SGLang builds its process groups once a process):
    time to first token and tokens/s at concurrency 1 and 32."""
    import torch

    from worker.stages.base import RequestMeta

    cuda = torch.cuda.is_available() and not dry
    device = "cuda:0" if cuda else "cpu"
    if model == "omni":
        ex = _executor(MODELS / "tiny-omni.yaml", "thinker", device, False,
                       dtype="bf16" if cuda else None)  # fmt: skip
        for c in (1, 32):
            ttft, rate = _thinker_at(ex, c, RequestMeta)
            print(
                f"RESULT tiny-omni thinker ({ex.ctx.dtype} on {device}) c={c}: time to first "
                f"token {ttft * 1000:.1f} ms (median), {rate:.1f} tokens/s",
                flush=True,
            )
    else:
        spec = MODELS / ("qwen3-asr-0.6b.yaml" if cuda else "tiny-qwen3-asr.yaml")
        ex = _executor(spec, "asr", device, cuda, tokenizer_from=MODELS / "tiny-qwen3-asr.yaml")
        for c in (1, 32):
            ttft, rate = _asr_at(ex, c)
            print(f"RESULT Qwen3-ASR{' 0.6B' if cuda else ' tiny'} ({ex.ctx.dtype} on {device}) "
                  f"c={c}: time to first token {ttft * 1000:.1f} ms (median), {rate:.1f} "
                  "tokens/s", flush=True)  # fmt: skip
    return 0


def _thinker_at(thinker, concurrency: int, meta_cls) -> tuple[float, float]:
    from worker.models.qwen3_omni.payloads import OmniPrompt

    cfg = json.loads((thinker.ctx.checkpoint / "config.json").read_text())
    meta = meta_cls("chat", frozenset({"text"}), max_tokens=32)
    t0 = time.perf_counter()
    for i in range(concurrency):
        text = [10 + (k * 7 + i) % 90 for k in range(200)]
        ids = [cfg["im_start_token_id"], cfg["user_token_id"], *text, cfg["im_end_token_id"],
               cfg["im_start_token_id"], cfg["assistant_token_id"]]  # fmt: skip
        thinker.start(f"c{i}", meta, {"preprocessing": OmniPrompt(ids)})
    first: dict[str, float] = {}
    left, tokens = concurrency, 0
    while left:
        for kind, rid, payload in thinker.step() if thinker.next_deadline() is not None else []:
            if kind == "chunk" and getattr(payload, "tokens", None):
                first.setdefault(rid, time.perf_counter() - t0)
                tokens += len(payload.tokens)
            elif kind == "done":
                left -= 1
    firsts = sorted(first.values())
    return firsts[len(firsts) // 2], tokens / (time.perf_counter() - t0)


def _asr_at(asr, concurrency: int) -> tuple[float, float]:
    from worker.contract.options import RequestInput
    from worker.stages.base import REQUEST_INPUT, RequestMeta

    rng = np.random.default_rng(0)
    n = 16_000 * 5
    t = np.arange(n) / 16_000
    t0 = time.perf_counter()
    for i in range(concurrency):
        wav = 0.3 * np.sin(2 * np.pi * (200 + 10 * i) * t) + 0.01 * rng.standard_normal(n)
        request = RequestInput("transcription", audio=wav.astype("f4"))
        asr.start(
            f"r{i}", RequestMeta("transcription", frozenset({"text"})), {REQUEST_INPUT: request}
        )
    first: dict[str, float] = {}
    tokens = 0
    while asr.queue_depth():
        for kind, rid, data in asr.step():
            if kind == "out" and not str(data[1]).startswith("\x00"):
                first.setdefault(rid, time.perf_counter() - t0)
            elif kind == "done":
                tokens += int(data.get("completion_tokens", 0))
    firsts = sorted(first.values()) or [float("nan")]
    return firsts[len(firsts) // 2], tokens / (time.perf_counter() - t0)


if __name__ == "__main__":
    raise SystemExit(main())
