"""The autoregressive stage of a plain transformers language model (a bare checkpoint such as
Qwen3-8B), batched at the step level. Model families with their own thinkers and talkers live
under ``worker/models/``.

Every ``step`` first prefills newly started requests one by one (each yields its first token at
once and joins the batch), then runs ONE batched decode step for all running requests, so a new
request never waits for the running ones to finish. Tokens are picked as the request asks
(``worker.stages.sampling``: greedy by default) with the checkpoint's ``generation_config.json``
``suppress_tokens``/``eos_token_id``: a greedy or seeded request gives the same tokens on every
worker. ``logprobs`` and ``response_format`` are the Qwen3-Omni thinker's: refused here.

What a request feeds the model is a ``Program``: ``TextProgram`` (a prompt; streams tokens,
and hidden states if asked).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from worker.models.checkpoint import load_stage_model
from worker.stages.base import (
    CHUNK,
    DONE,
    END,
    INVALID,
    Output,
    RequestMeta,
    StageExecutor,
)
from worker.stages.generation_config import stop_tokens
from worker.stages.kvbatch import KVBatch
from worker.stages.sampling import SamplerState, Sampling, pick


@dataclass(slots=True)
class ARRequest:
    rid: str
    meta: RequestMeta
    max_new: int
    pos: int = 0  # position id of the next input
    generated: int = 0
    last: int = -1  # last generated token/code
    want_hidden: bool = False
    # text program
    prompt: list[int] = field(default_factory=list)
    prompt_len: int = 0
    stream_ended: bool = False
    upstream_info: dict[str, Any] = field(default_factory=dict)
    sampler: SamplerState = field(default_factory=lambda: SamplerState(Sampling()))


class AutoregressiveExecutor(StageExecutor):
    def load(self) -> None:
        import torch

        self.torch = torch
        ctx = self.ctx
        self.model = load_stage_model(ctx.name, ctx.stage, ctx.checkpoint, ctx.device)
        self.config = self.model.config
        self.embed = self.model.get_input_embeddings()
        stops = stop_tokens(self.ctx.component_dir(), getattr(self.config, "eos_token_id", None))
        self.eos = set(stops.eos)
        vocab = self.model.get_output_embeddings().weight.shape[0]
        self.suppress = stops.suppress_mask(torch, vocab, self.ctx.device)
        streamed_into = any(self.ctx.name in s.stream_to for s in self.ctx.spec.stages.values())
        if streamed_into:
            raise ValueError(
                f"stage {self.ctx.name}: a stage fed by a stream (a talker) is model-specific; "
                "its family under worker/models/ implements it"
            )
        self.program: Program = TextProgram(self)
        self.engine = self.ctx.stage.engine
        self.pending: list[ARRequest] = []
        self.running: dict[str, ARRequest] = {}
        self.batch = KVBatch()

    def warmup(self) -> None:
        torch = self.torch
        with torch.inference_mode():
            dev = self.ctx.device  # (CPU ids into a CUDA embedding crashed the start on a GPU)
            first = torch.tensor([[0, 1, 2]], device=dev)
            out = self.model(inputs_embeds=self.embed(first), use_cache=True)
            self.model(
                inputs_embeds=self.embed(torch.tensor([[3]], device=dev)),
                cache=out.cache,
                use_cache=True,
            )

    # ---- interface -------------------------------------------------------------------------
    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        self.pending.append(self.program.new(rid, meta, inputs))

    def feed(self, rid: str, src: str, data: Any) -> None:
        r = self._find(rid)
        if r is not None:
            self.program.feed(r, data)

    def end_stream(self, rid: str, src: str, info: dict[str, Any]) -> None:
        r = self._find(rid)
        if r is not None:
            r.stream_ended = True
            r.upstream_info.update(info)

    def abort(self, rid: str) -> None:
        self.pending = [r for r in self.pending if r.rid != rid]
        if self.running.pop(rid, None) is not None:
            self.batch.leave({rid})

    def _can_admit(self, r: ARRequest, budget: int) -> bool:
        """Room for one more running request: max running requests, the step's prefill token
        budget (so long prompts do not stall running decodes), and the plan's KV capacity
        (the left-padded batch holds rows x longest row)."""
        if len(self.running) >= self.ctx.max_running_requests:
            return False
        if not self.running:
            return True
        if len(r.prompt) > budget and budget < self._prefill_budget():
            return False  # one prefill per step may exceed the budget, so none starves
        kv = self.ctx.kv_tokens
        width = max(self.batch.mask.shape[1] if self.batch.mask is not None else 0, len(r.prompt))
        return not kv or (len(self.batch) + 1) * width <= kv

    def next_deadline(self) -> float | None:
        if self.pending and self._can_admit(self.pending[0], self._prefill_budget()):
            return 0.0
        if any(self.program.ready(r) or self.program.finished(r) for r in self.running.values()):
            return 0.0
        return None

    def queue_depth(self) -> int:
        return len(self.pending) + len(self.running)

    def step(self) -> list[Output]:
        outs: list[Output] = []
        budget = self._prefill_budget()
        with self.torch.inference_mode():
            while self.pending and self._can_admit(self.pending[0], budget):
                r = self.pending.pop(0)
                budget -= max(len(r.prompt), 1)
                try:
                    outs += self._prefill(r)
                except ValueError as exc:
                    outs.append((INVALID, r.rid, f"{self.ctx.name}: {exc}"))
            outs += self._decode()
        return outs

    # ---- internals -------------------------------------------------------------------------
    def _prefill_budget(self) -> int:
        return int(getattr(self.engine, "prefill_chunk_tokens", 2048))

    def _find(self, rid: str) -> ARRequest | None:
        r = self.running.get(rid)
        if r is None:
            r = next((p for p in self.pending if p.rid == rid), None)
        return r

    def _pick(self, logits: Any, rows: list[ARRequest]) -> list[int]:
        logits = logits.float().masked_fill(self.suppress[: logits.shape[-1]], float("-inf"))
        tokens = pick(self.torch, logits, [r.sampler for r in rows])
        for r, t in zip(rows, tokens, strict=True):
            r.sampler.add(t)
        return tokens

    def _prefill(self, r: ARRequest) -> list[Output]:
        embeds = self.program.prefill_embeds(r)
        out = self.model(inputs_embeds=embeds, use_cache=True, output_hidden_states=r.want_hidden)
        hidden = out.hidden_states[-1][0] if r.want_hidden else None
        r.pos = embeds.shape[1]
        outs = self.program.after_prefill(r, out.logits[0, -1:], hidden)
        if r.rid in self.running:  # the program keeps it for decode steps
            self.batch.join(r.rid, out.cache, r.pos)
        return outs

    def _decode(self) -> list[Output]:
        torch = self.torch
        outs: list[Output] = []
        finished = {rid for rid, r in self.running.items() if self.program.finished(r)}
        for rid in finished:
            outs += self.program.finish(self.running.pop(rid))
        if finished:
            self.batch.leave(finished)
        rows = [self.running[rid] for rid in self.batch.rids]
        valid = [self.program.ready(r) for r in rows]
        if not any(valid):
            return outs
        embeds = torch.cat(
            [
                self.program.step_embeds(r) if v else self._bubble()
                for r, v in zip(rows, valid, strict=False)
            ]
        )
        positions = torch.tensor([r.pos for r in rows], device=embeds.device)
        want_hidden = any(r.want_hidden for r in rows)
        logits, hidden = self.batch.step(
            self.model, embeds, torch.tensor(valid, device=embeds.device), positions, want_hidden
        )
        live = [i for i, v in enumerate(valid) if v]  # (a bubble row draws nothing)
        tokens = dict(zip(live, self._pick(logits[live], [rows[i] for i in live]), strict=True))
        done: set[str] = set()
        for i, (r, v) in enumerate(zip(rows, valid, strict=False)):
            if not v:
                continue
            r.pos += 1
            h = hidden[i] if hidden is not None and r.want_hidden else None
            outs += self.program.on_token(r, tokens[i], h)
            if r.rid not in self.running:
                done.add(r.rid)
        if done:
            self.batch.leave(done)
        return outs

    def _bubble(self) -> Any:
        return self.embed.weight.new_zeros(1, 1, self.embed.weight.shape[1])


class Program(ABC):
    """What one kind of autoregressive request does around the shared batched decode."""

    def __init__(self, ex: AutoregressiveExecutor) -> None:
        self.ex = ex

    @abstractmethod
    def new(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> ARRequest: ...
    def feed(self, r: ARRequest, data: Any) -> None:
        raise RuntimeError("no stream input expected")

    @abstractmethod
    def prefill_embeds(self, r: ARRequest) -> Any: ...
    @abstractmethod
    def after_prefill(self, r: ARRequest, logits: Any, hidden: Any) -> list[Output]: ...
    def ready(self, r: ARRequest) -> bool:
        return True

    def finished(self, r: ARRequest) -> bool:
        return False

    def finish(self, r: ARRequest) -> list[Output]:
        return []

    @abstractmethod
    def step_embeds(self, r: ARRequest) -> Any: ...
    @abstractmethod
    def on_token(self, r: ARRequest, token: int, hidden: Any) -> list[Output]: ...


def _np(t: Any) -> np.ndarray:
    return t.detach().float().cpu().numpy()


class TextProgram(Program):
    """A prompt -> streamed tokens (+ hidden states when asked)."""

    def new(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> ARRequest:
        (payload,) = inputs.values()
        eng = self.ex.engine
        limit = (
            eng.max_new_tokens
            if meta.max_tokens is None
            else min(meta.max_tokens, eng.max_new_tokens)
        )
        prompt = list(payload["input_ids"])
        return ARRequest(
            rid,
            meta,
            max_new=max(1, limit),
            prompt=prompt,
            want_hidden="audio" in meta.outputs,
            sampler=SamplerState.of(meta.sampling, prompt),
        )

    def prefill_embeds(self, r: ARRequest) -> Any:
        if r.meta.logprobs is not None or r.meta.grammar is not None:
            # (the Qwen3-Omni thinker serves them; refused here rather than ignored)
            raise ValueError("logprobs and response_format are not served by this model")
        torch = self.ex.torch
        ids = torch.tensor([r.prompt], device=self.ex.ctx.device)
        embeds = self.ex.embed(ids)
        room = self.ex.engine.context_length - embeds.shape[1]
        if room <= 0:
            raise ValueError(
                f"prompt of {embeds.shape[1]} tokens exceeds the context length "
                f"{self.ex.engine.context_length}"
            )
        r.max_new = min(r.max_new, max(room, 1))
        r.prompt_len = embeds.shape[1]
        return embeds

    def after_prefill(self, r: ARRequest, logits: Any, hidden: Any) -> list[Output]:
        self.ex.running[r.rid] = r
        return self.on_token(
            r, self.ex._pick(logits, [r])[0], hidden[-1] if hidden is not None else None
        )

    def step_embeds(self, r: ARRequest) -> Any:
        return self.ex.embed(self.ex.torch.tensor([[r.last]], device=self.ex.ctx.device))

    def on_token(self, r: ARRequest, token: int, hidden: Any) -> list[Output]:
        if token in self.ex.eos:
            return self._stop(r, "stop")
        r.generated += 1
        r.last = token
        data: dict[str, Any] = {
            "tokens": [token],
            "hidden": _np(hidden)[None] if hidden is not None else None,
        }
        if r.generated == 1:  # (decode's usage if a stop text ends the reply)
            data["prompt_tokens"] = r.prompt_len
        outs: list[Output] = [(CHUNK, r.rid, data)]
        if r.generated >= r.max_new:
            outs += self._stop(r, "length")
        return outs

    def _stop(self, r: ARRequest, reason: str) -> list[Output]:
        self.ex.running.pop(r.rid, None)
        info = self._info(r, reason)
        return [(END, r.rid, info), (DONE, r.rid, info)]

    def _info(self, r: ARRequest, reason: str) -> dict[str, Any]:
        return {
            "finish_reason": reason,
            "prompt_tokens": r.prompt_len,
            "completion_tokens": r.generated,
        }
