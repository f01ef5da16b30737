"""Real-size Qwen3-Omni, Qwen3-TTS and Qwen3-ASR stages on one GPU (seeded random weights, no
download), or the tiny models on CPU: per-stage peak memory against omni-plan's figures, then
Omni's thinker (time to first token, tokens/s) and its talker with code2wav (first audio,
real-time factor; the thinker's part synthetic), TTS's first packet and real-time factor (a
cloned voice, all three stages), each at concurrency 1 and 32, then ASR's time to text and
real-time factor. Run by hand:

    python bench/gpu_check.py --device cuda          # Omni 30B-A3B, TTS 1.7B Base, ASR 0.6B
    python bench/gpu_check.py --device cuda --models tts asr
    python bench/gpu_check.py                        # tiny-omni, tiny TTS Base, tiny ASR on CPU

The stages are the worker's own executors, driven in one process the way the coordinator
drives them (talker -> code2wav; preprocessing -> tts_engine => vocoder; asr), so
stage-to-stage tensors stay on the device; one SGLang engine a process, so each check runs in a
process of its own. Omni's prompt is synthetic token ids. The
real TTS and ASR configs come without a tokenizer: they are served with the tiny checkpoint's
byte-level tokenizer, its few text token ids written into a copy of the real config (the
architecture and every size stay the real ones). Figures go to docs/omni-worker.md.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "configs" / "models"
# model -> (real-size spec on a GPU, tiny spec on CPU, the stages this check loads)
CHECKS = {
    "omni": (
        "qwen3-omni-30b-a3b-speech.yaml",
        "tiny-omni.yaml",
        ("audio_encoder", "image_encoder", "thinker"),
    ),
    "tts": (
        "qwen3-tts-12hz-1.7b.yaml",
        "tiny-qwen3-tts-base.yaml",
        ("preprocessing", "tts_engine", "vocoder"),
    ),
    "asr": ("qwen3-asr-0.6b.yaml", "tiny-qwen3-asr.yaml", ("asr",)),
    # the talker in a process of its own (SGLang runs one engine a process: "omni"'s thinker)
    "omni-talker": (
        "qwen3-omni-30b-a3b-speech.yaml",
        "tiny-omni.yaml",
        ("talker", "code2wav"),
    ),
}
TINY_FOR = {"tts": "tiny-qwen3-tts-base.yaml", "asr": "tiny-qwen3-asr.yaml"}
GPU = "1xH200-141GB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--models", nargs="+", choices=sorted(CHECKS), default=sorted(CHECKS))
    ap.add_argument(
        "--real-size",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="real-size random weights (default: on cuda) or the tiny checkpoints",
    )
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=64, help="Omni/ASR tokens, TTS frames")
    ap.add_argument("--audio-seconds", type=float, default=30.0, help="ASR input length")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    real = cuda if args.real_size is None else args.real_size
    models = [name for name in ("omni", "omni-talker", "tts", "asr") if name in args.models]
    if len(models) > 1:
        # one process per model: SGLang's engine (the thinker's, the talker's, the ASR's)
        # builds its process groups once per process
        rest = [a for a in sys.argv[1:] if a not in CHECKS and a != "--models"]
        for name in models:
            subprocess.run([sys.executable, __file__, *rest, "--models", name], check=True)
        return
    for name in models:
        print(f"\n== {name} ({'real size, random weights' if real else 'tiny'}) on {args.device}")
        executors = _load(name, real, cuda)
        if name == "omni":
            from worker.stages.base import RequestMeta

            for concurrency in (1, 32):
                _thinker_at(executors["thinker"], concurrency, args.prompt_tokens,
                            args.new_tokens, RequestMeta)  # fmt: skip
        elif name == "omni-talker":
            for concurrency in (1, 32):
                _drive_talker(executors, args.prompt_tokens, args.new_tokens, concurrency)
        elif name == "tts":
            for concurrency in (1, 32):
                _drive_tts(executors, args.new_tokens, concurrency)
        else:
            executors["asr"].max_new = args.new_tokens
            _drive_asr(executors["asr"], args.audio_seconds)


def _load(name: str, real: bool, cuda: bool) -> dict:
    """The check's stages loaded (random weights at real size) and warmed up, with a table of
    planned, loaded and peak bytes per stage."""
    import torch

    from planner.api import plan_spec
    from planner.loader import load_spec
    from worker.contract.stage_context import StageContext
    from worker.models.checkpoint import resolve_checkpoint
    from worker.models.registry import make_executor

    real_spec, tiny_spec, stages = CHECKS[name]
    spec_path = MODELS / (real_spec if real else tiny_spec)
    spec = load_spec(spec_path).spec
    if not cuda:
        for stage in spec.stages.values():
            stage.dtype = "fp32"
    plan = plan_spec(spec_path, GPU).plan if real else None
    planned = {
        sp.stage: sp.memory.weights
        for node in (plan.nodes if plan else [])
        for pp in node.processes
        for sp in pp.stages
    }
    kv_tokens = {  # the KV pools the plan sizes (SGLang's pool under the thinker takes it)
        sp.stage: sp.kv_tokens
        for node in (plan.nodes if plan else [])
        for pp in node.processes
        for sp in pp.stages
    }
    cache = Path.home() / ".cache" / "omni-fleet"
    checkpoint = resolve_checkpoint(spec, spec_path, cache)
    if real and name in TINY_FOR:
        tiny_path = MODELS / TINY_FOR[name]
        tiny = resolve_checkpoint(load_spec(tiny_path).spec, tiny_path, cache)
        checkpoint = _with_tiny_tokenizer(checkpoint, tiny)
    device = "cuda:0" if cuda else "cpu"
    executors = {}
    print(f"{'stage':<14} {'planned MB':>11} {'loaded MB':>11} {'peak MB':>9} {'load s':>7}")
    for stage_name in stages:
        stage = spec.stages[stage_name]
        ctx = StageContext(
            name=stage_name,
            spec=spec,
            stage=stage,
            checkpoint=checkpoint,
            device=device if stage.device != "cpu" else "cpu",
            max_running_requests=stage.engine.max_running_requests,
            kv_tokens=kv_tokens.get(stage_name, 0),
            # Omni draws random weights at tiny size too (the seeded tiny talker can end before
            # its first audio); TTS and ASR run their tiny checkpoints as served
            extra={"random_weights": real or name.startswith("omni")},
        )
        base = torch.cuda.memory_allocated() if cuda else 0
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        ex = make_executor(ctx)
        ex.load()
        ex.warmup()
        took = time.perf_counter() - t0
        peak = (torch.cuda.max_memory_allocated() - base) if cuda else 0
        loaded = ctx.extra.get("loaded")
        loaded_bytes = loaded.elements * stage.dtype.bytes if loaded else 0
        print(
            f"{stage_name:<14} {planned.get(stage_name, 0) / 1e6:>11.1f} "
            f"{loaded_bytes / 1e6:>11.1f} {peak / 1e6:>9.1f} {took:>7.1f}"
        )
        executors[stage_name] = ex
    return executors


def _with_tiny_tokenizer(real: Path, tiny: Path) -> Path:
    """A copy of the real config directory that the tiny checkpoint's tokenizer can drive: its
    config files, with the text token ids the tiny config names (``*_token_id`` outside the
    talker's codec vocabulary) set to the tiny tokenizer's; the tokenizer, chat template and
    generation defaults from the tiny checkpoint. No weights: the stages draw them."""
    out = Path(tempfile.mkdtemp(prefix=f"gpu-check-{real.name}-"))
    atexit.register(shutil.rmtree, out, True)
    shutil.copytree(real, out, dirs_exist_ok=True)
    for f in tiny.iterdir():
        if f.is_file() and (f.name.startswith(("tokenizer", "chat_template", "special_tokens"))
                            or f.name == "generation_config.json"):  # fmt: skip
            shutil.copyfile(f, out / f.name)
    config = json.loads((out / "config.json").read_text())
    tiny_config = json.loads((tiny / "config.json").read_text())
    for key in ("", "thinker_config"):
        src = tiny_config.get(key, {}) if key else tiny_config
        dst = config.get(key, {}) if key else config
        for k, v in src.items():
            if k.endswith("_token_id") and isinstance(v, int) and k in dst:
                dst[k] = v
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def _drive_tts(executors: dict, new_tokens: int, concurrency: int) -> None:
    """``concurrency`` cloned-voice requests at once (a 3 s reference with its transcript:
    reference codes, speaker embedding, talker, chunked decode) through preprocessing ->
    tts_engine => vocoder."""
    from worker.contract.options import RequestInput, SpeechOptions
    from worker.stages.base import REQUEST_INPUT, RequestMeta

    pre, talker, vocoder = (executors[s] for s in ("preprocessing", "tts_engine", "vocoder"))
    t = np.arange(72_000) / 24_000
    voice = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype("f4")
    opts = SpeechOptions(ref_text="a reference voice", voice_key="bench")
    meta = RequestMeta("speech", frozenset({"audio"}))
    t0 = time.perf_counter()
    rids = [f"r{i}" for i in range(concurrency)]
    for i, rid in enumerate(rids):
        req = RequestInput("speech", text=f"Hello number {i} from the GPU check. " * 4,
                           voice="bench", voice_audio=voice, speech=opts)  # fmt: skip
        pre.start(rid, meta, {REQUEST_INPUT: req})
        ((kind, _, payload),) = pre.step()
        if kind != "final":
            raise RuntimeError(f"preprocessing refused the request: {payload}")
        payload["max_new"] = new_tokens
        talker.start(rid, meta, {"preprocessing": payload})
        vocoder.start(rid, meta, {})
    first: dict[str, float] = {}
    samples = frames = 0
    left = concurrency
    while left:
        for kind, rid, data in talker.step() if talker.next_deadline() is not None else []:
            if kind == "chunk":
                frames += not data.context
                vocoder.feed(rid, "tts_engine", data)
            elif kind == "end":
                vocoder.end_stream(rid, "tts_engine", data)
        heard, ended = _vocode(vocoder, t0, first)
        samples, left = samples + heard, left - ended
    _report_speech(concurrency, first, samples, time.perf_counter() - t0)
    print(f"talker frames        {frames:8d} ({frames / (time.perf_counter() - t0):.1f} frames/s)")


def _vocode(vocoder, t0: float, first: dict[str, float]) -> tuple[int, int]:
    """One step of a vocoder stage, if it has work: (samples it put out, requests it ended);
    each request's first audio is timed into ``first``."""
    samples = ended = 0
    for kind, rid, data in vocoder.step() if vocoder.next_deadline() is not None else []:
        if kind == "out":
            first.setdefault(rid, time.perf_counter() - t0)
            samples += len(data[1])
        ended += kind == "done"
    return samples, ended


def _report_speech(concurrency: int, first: dict[str, float], samples: int, total: float) -> None:
    """First packet (median and worst over the requests) and the real-time factor of one
    stream (wall time over a stream's mean audio: below 1 is faster than real time)."""
    firsts = sorted(first.values())
    seconds = samples / 24_000
    rtf = total / max(seconds / concurrency, 1e-9)
    print(f"c={concurrency:<3} first packet {firsts[len(firsts) // 2] * 1000:8.1f} ms (median), "
          f"{firsts[-1] * 1000:8.1f} ms (worst)")  # fmt: skip
    print(f"c={concurrency:<3} audio {seconds:8.2f} s in {total:.2f} s: {seconds / total:.2f} "
          f"audio-s/s, real-time factor per stream {rtf:.2f}")  # fmt: skip


def _drive_asr(asr, seconds: float) -> None:
    """One transcription of ``seconds`` of speech-like audio (bursts and pauses)."""
    from worker.contract.options import RequestInput
    from worker.stages.base import REQUEST_INPUT, RequestMeta

    rng = np.random.default_rng(0)
    n = int(seconds * 16_000)
    t = np.arange(n) / 16_000
    wav = 0.3 * np.sin(2 * np.pi * 220 * t) * (np.sin(2 * np.pi * 0.7 * t) > 0)
    wav = (wav + 0.01 * rng.standard_normal(n)).astype("f4")
    t0 = time.perf_counter()
    asr.start("r", RequestMeta("transcription", frozenset({"text"})),
              {REQUEST_INPUT: RequestInput("transcription", audio=wav)})  # fmt: skip
    first = None
    info: dict = {}
    while asr.queue_depth():
        for kind, _, data in asr.step():
            if kind == "out" and not str(data[1]).startswith("\x00"):
                first = first or time.perf_counter() - t0
            elif kind == "done":
                info = data
            elif kind == "invalid":
                raise RuntimeError(f"asr refused the request: {data}")
    total = time.perf_counter() - t0
    print(f"time to text         {(first or total) * 1000:8.1f} ms")
    print(f"tokens               {info.get('prompt_tokens', 0):8d} prompt, "
          f"{info.get('completion_tokens', 0)} generated")  # fmt: skip
    print(f"audio                {seconds:8.2f} s in {total:.2f} s "
          f"(real-time factor {total / seconds:.3f})")  # fmt: skip


def _prompt_ids(thinker, prompt_tokens: int, salt: int = 0) -> list[int]:
    cfg = json.loads((thinker.ctx.checkpoint / "config.json").read_text())
    big = cfg["thinker_config"]["text_config"]["vocab_size"] > 2000
    text = [(1000 if big else 10) + (i * 7 + salt) % (1000 if big else 90)
            for i in range(prompt_tokens)]  # fmt: skip
    ids = [cfg["im_start_token_id"], cfg["user_token_id"], salt + 11, *text]
    return [*ids, cfg["im_end_token_id"], cfg["im_start_token_id"], cfg["assistant_token_id"]]


def _thinker_at(thinker, concurrency: int, prompt_tokens: int, new_tokens: int, meta_cls) -> None:
    """The thinker alone (text out) with ``concurrency`` requests at once, each its own prompt
    (no shared prefix): time to first token (median) and tokens/s."""
    meta = meta_cls("chat", frozenset({"text"}), max_tokens=new_tokens)
    t0 = time.perf_counter()
    for i in range(concurrency):
        ids = _prompt_ids(thinker, prompt_tokens, salt=i + 1)
        thinker.start(f"c{i}", meta, {"preprocessing": {"input_ids": ids, "audio_lens": []}})
    first: dict[str, float] = {}
    left, tokens = concurrency, 0
    while left:
        for kind, rid, payload in thinker.step() if thinker.next_deadline() is not None else []:
            if kind == "chunk" and payload.tokens:
                first.setdefault(rid, time.perf_counter() - t0)
                tokens += len(payload.tokens)
            elif kind == "done":
                left -= 1
    wall = time.perf_counter() - t0
    ttft = sorted(first.values())[len(first) // 2] if first else float("nan")
    print(f"thinker c={concurrency:<3} time to first token {ttft * 1000:8.1f} ms (median), "
          f"{tokens / wall:8.1f} tokens/s")  # fmt: skip


def _drive_talker(executors, prompt_tokens: int, new_tokens: int, concurrency: int) -> None:
    """``concurrency`` spoken replies at once through talker => code2wav, the thinker's part
    synthetic (random prompt states and reply embeddings of the real widths, all there at
    the start): the talker's and the vocoder's own speed."""
    from worker.stages.base import RequestMeta

    talker, code2wav = executors["talker"], executors["code2wav"]
    cfg, width = talker.config, talker.tc.thinker_hidden_size
    outputs = frozenset({"text", "audio"})
    rng = np.random.default_rng(0)
    rids = [f"t{i}" for i in range(concurrency)]
    for i, rid in enumerate(rids):
        text = [10 + (i + k) % 90 for k in range(prompt_tokens)]
        ids = [cfg.im_start_token_id, cfg.user_token_id, *text, cfg.im_end_token_id,
               cfg.im_start_token_id, cfg.assistant_token_id, 10]  # fmt: skip
        meta = RequestMeta("chat", outputs, voice="ethan")
        talker.start(rid, meta, {"preprocessing": {"input_ids": ids, "audio_lens": []}})
        code2wav.start(rid, RequestMeta("chat", outputs), {})
        states = rng.standard_normal((2, len(ids), width)).astype(np.float32) * 0.02
        reply = rng.standard_normal((new_tokens, width)).astype(np.float32) * 0.02
        talker.feed(rid, "thinker", {
            "tokens": list(range(11, 11 + new_tokens)), "embeds": reply,
            "prompt_embed": states[0], "prompt_hidden": states[1], "tts_embeds": reply[:3],
        })  # fmt: skip
        talker.end_stream(rid, "thinker", {"finish_reason": "stop"})
    t0 = time.perf_counter()
    first_audio: dict[str, float] = {}
    samples = 0
    left = concurrency
    while left:
        for kind, rid, payload in talker.step() if talker.next_deadline() is not None else []:
            if kind == "chunk":
                code2wav.feed(rid, "talker", payload)
            elif kind == "end":
                code2wav.end_stream(rid, "talker", payload)
            elif kind == "invalid":
                raise RuntimeError(f"the talker refused {rid}: {payload}")
        heard, ended = _vocode(code2wav, t0, first_audio)
        samples, left = samples + heard, left - ended
    _report_speech(concurrency, first_audio, samples, time.perf_counter() - t0)


if __name__ == "__main__":
    main()
