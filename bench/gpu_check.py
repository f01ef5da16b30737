"""Real-size Qwen3-Omni stages on one GPU (seeded random weights, no download), or the tiny model
on CPU: per-stage peak memory against omni-plan's figures, time to first token, tokens/s, time to
first audio. Run by hand:

    python bench/gpu_check.py --device cuda          # qwen3-omni-30b-a3b-speech, bf16
    python bench/gpu_check.py                        # tiny-omni on CPU

The stages are the worker's own executors (worker/models/qwen3_omni/), driven in one process the
way the coordinator drives them (thinker chunks -> talker -> code2wav), so stage-to-stage tensors
stay on the device. The prompt is synthetic token ids (the real checkpoint's tokenizer is not in
configs/hf). Figures go to docs/omni-worker.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPU_SPEC = REPO / "configs" / "models" / "qwen3-omni-30b-a3b-speech.yaml"
CPU_SPEC = REPO / "configs" / "models" / "tiny-omni.yaml"
GPU_STAGES = ("audio_encoder", "image_encoder", "thinker", "talker", "code2wav")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--spec", type=Path, default=None)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()

    import torch

    from planner.api import plan_spec
    from planner.loader import load_spec
    from worker.models.checkpoint import resolve_checkpoint
    from worker.stages.base import RequestMeta, StageContext
    from worker.stages.registry import make_executor

    cuda = args.device.startswith("cuda")
    spec_path = args.spec or (GPU_SPEC if cuda else CPU_SPEC)
    loaded = load_spec(spec_path)
    spec = loaded.spec
    if not cuda:
        for stage in spec.stages.values():
            stage.dtype = "fp32"
    plan = plan_spec(spec_path, "1xH200-141GB").plan if cuda else None
    planned = {
        sp.stage: sp.memory.weights
        for node in (plan.nodes if plan else [])
        for pp in node.processes
        for sp in pp.stages
    }
    checkpoint = resolve_checkpoint(spec, spec_path, Path.home() / ".cache" / "omni-fleet")
    device = "cuda:0" if cuda else "cpu"
    executors = {}
    print(f"{'stage':<14} {'planned MB':>11} {'loaded MB':>11} {'peak MB':>9} {'load s':>7}")
    for name in GPU_STAGES:
        stage = spec.stages[name]
        ctx = StageContext(
            name=name,
            spec=spec,
            stage=stage,
            checkpoint=checkpoint,
            device=device,
            max_running_requests=stage.engine.max_running_requests,
            extra={"random_weights": True},
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
        loaded_bytes = ctx.extra["loaded"].elements * stage.dtype.bytes
        print(
            f"{name:<14} {planned.get(name, 0) / 1e6:>11.1f} {loaded_bytes / 1e6:>11.1f} "
            f"{peak / 1e6:>9.1f} {took:>7.1f}"
        )
        executors[name] = ex
    _drive(executors, spec, args.prompt_tokens, args.new_tokens, RequestMeta)


def _drive(executors, spec, prompt_tokens: int, new_tokens: int, meta_cls) -> None:
    """One request through thinker => talker => code2wav, as the coordinator routes it."""
    import json

    thinker, talker, code2wav = (executors[s] for s in ("thinker", "talker", "code2wav"))
    cfg = json.loads((thinker.ctx.checkpoint / "config.json").read_text())
    text_ids = (
        list(range(1000, 1000 + prompt_tokens))
        if cfg["thinker_config"]["text_config"]["vocab_size"] > 2000
        else [10] * prompt_tokens
    )
    ids = [cfg["im_start_token_id"], cfg["user_token_id"], *text_ids, cfg["im_end_token_id"]]
    ids += [cfg["im_start_token_id"], cfg["assistant_token_id"], 10]
    prompt = {"input_ids": ids, "audio_lens": []}
    outputs = frozenset({"text", "audio"})
    thinker.start(
        "r",
        meta_cls("chat", outputs, max_tokens=new_tokens, stream_targets=("decode", "talker")),
        {"preprocessing": prompt},
    )
    talker.start("r", meta_cls("chat", outputs, voice="ethan"), {"preprocessing": prompt})
    code2wav.start("r", meta_cls("chat", outputs), {})
    t0 = time.perf_counter()
    first_token = first_audio = thinker_done = None
    tokens = samples = 0
    done = False
    while not done:
        for kind, _rid, payload in thinker.step() if thinker.next_deadline() is not None else []:
            if kind == "chunk":
                first_token = first_token or time.perf_counter() - t0
                tokens += len(payload["tokens"])
                talker.feed("r", "thinker", payload)
            elif kind == "end":
                thinker_done = time.perf_counter() - t0
                talker.end_stream("r", "thinker", payload)
        for kind, _rid, payload in talker.step() if talker.next_deadline() is not None else []:
            if kind == "chunk":
                code2wav.feed("r", "talker", payload)
            elif kind == "end":
                code2wav.end_stream("r", "talker", payload)
        for kind, _rid, payload in code2wav.step() if code2wav.next_deadline() is not None else []:
            if kind == "out":
                first_audio = first_audio or time.perf_counter() - t0
                samples += len(payload[1])
            elif kind == "done":
                done = True
    total = time.perf_counter() - t0
    print(f"time to first token  {first_token * 1000:8.1f} ms")
    print(f"time to first audio  {first_audio * 1000:8.1f} ms")
    print(f"thinker finished at  {thinker_done * 1000:8.1f} ms")
    print(f"thinker tokens/s     {tokens / thinker_done:8.1f} ({tokens} tokens)")
    seconds = samples / 24000
    rtf = total / max(seconds, 1e-9)
    print(f"audio                {seconds:8.2f} s in {total:.2f} s (real-time factor {rtf:.2f})")


if __name__ == "__main__":
    main()
