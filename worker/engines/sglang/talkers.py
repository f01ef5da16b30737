"""What a talker's model class on SGLang does alike (the Qwen3-TTS talker's and the Qwen3-Omni
talker's, each with its family): its engine, its prompt rows, and its picks handed over.

A talker's prompt is embeddings and its codes are picked in the model (the official masks, the
request's own sampler and generator), so:
- its spec says ``engine.prompt: embeddings``: SGLang runs it without its prefix cache (the
  token ids it holds are placeholders), without CUDA graphs (the forward reads per-request
  state in Python), without a grammar, and without mixed prefill (its decode rows are frames,
  not tokens): ``planner.engine_plan.sglang_args``;
- a prefill's rows are slices of each request's prompt, by SGLang's extend lengths;
- each row's pick goes to SGLang's sampler as the row's only finite logit: greedy there, it
  takes it.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from worker.contract.stage_context import StageContext
from worker.engines.sglang.engine import EngineSettings, SGLangEngine


def talker_engine(
    ctx: StageContext, write_model_dir: Callable[[Path, Path], Path]
) -> tuple[SGLangEngine, tempfile.TemporaryDirectory]:
    """SGLang's engine for a talker stage, and the directory its model is loaded from (what
    ``write_model_dir`` writes there: a config and links to the checkpoint's files; keep it
    as long as the engine)."""
    if ctx.stage.tp_size > 1:
        raise ValueError(
            f"stage {ctx.name}: tp_size {ctx.stage.tp_size}: a talker runs on one rank (its "
            "model reads each request's state in its stage's process); use tp_size 1"
        )
    if ctx.stage.engine.prompt != "embeddings":
        raise ValueError(
            f"stage {ctx.name}: a talker's prompts are embeddings its model builds from each "
            "request's state: its spec says engine.prompt: embeddings (SGLang then runs it "
            "without a prefix cache, CUDA graphs, mixed prefill or a grammar)"
        )
    model_dir = tempfile.TemporaryDirectory(prefix=f"omni-{ctx.name}-sglang-")
    settings = dataclasses.replace(
        EngineSettings.of_stage(ctx),
        model_path=write_model_dir(ctx.checkpoint, Path(model_dir.name)),
    )
    return SGLangEngine(settings), model_dir


def held_tensors(model: Any) -> tuple[int, int]:
    """(tensors, elements) a model holds, each shared tensor once."""
    held = {t.data_ptr(): t for t in model.state_dict().values()}
    return len(held), sum(t.numel() for t in held.values())


def prompt_rows(forward_batch: Any) -> list[tuple[int, int]]:
    """A prefill's (start, length) in each request's prompt, row by row."""
    return list(
        zip(forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu, strict=True)
    )


def row_ends(hidden: torch.Tensor, rows: list[tuple[int, int]]) -> torch.Tensor:
    """The hidden state at each prefill row's last position."""
    lengths = torch.tensor([n for _, n in rows], device=hidden.device)
    return hidden[lengths.cumsum(0) - 1]


def handed_over(picks: dict[int, int], rows: int, vocab: int, device: Any) -> Any:
    """SGLang's logits output whose only finite entry in row i is ``picks[i]`` (a row that
    picks nothing, an earlier chunk of a long prompt or an aborted request's: code 0, its
    result unread)."""
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    forced = torch.full((rows, vocab), float("-inf"), device=device)
    forced[:, 0] = 0.0
    for i, code in picks.items():
        forced[i, 0] = float("-inf")
        forced[i, code] = 0.0
    return LogitsProcessorOutput(next_token_logits=forced)
