"""The autoregressive stage of a plain language model (a bare checkpoint such as Qwen3-8B):
SGLang's scheduler (``worker.engines.sglang``) running SGLang's own model class for the
checkpoint's architecture. Model families with their own thinkers and talkers live under
``worker/models/``.

The prompt's token ids go to the engine and the tokens stream to decode as they come, with
their log probabilities when asked, within a ``response_format``'s grammar when there is one.
The checkpoint's ``generation_config.json`` gives the stop tokens, the suppressed ones and
what a request's unset sampling fields take.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from worker.contract.sampling import Sampling
from worker.engines.base import EngineEvent, EngineRequest
from worker.layers.generation_config import sampling_defaults, stop_tokens
from worker.stages.base import (
    CHUNK,
    DONE,
    END,
    INVALID,
    Output,
    RequestMeta,
    StageExecutor,
    check_prompt,
    input_of,
    reply_budget,
)
from worker.stages.payloads import PromptIds, TokenPiece


@dataclass(slots=True)
class _Request:
    prompt_len: int
    generated: int = 0
    started: bool = False


class LanguageModelExecutor(StageExecutor):
    def load(self) -> None:
        ctx = self.ctx
        if any(ctx.name in s.stream_to for s in ctx.spec.stages.values()):
            raise ValueError(
                f"stage {ctx.name}: a stage fed by a stream (a talker) is model-specific; "
                "its family under worker/models/ implements it"
            )
        config = json.loads((ctx.component_dir() / "config.json").read_text())
        stops = stop_tokens(ctx.component_dir(), config.get("eos_token_id"))
        self.eos = frozenset(stops.eos)
        self.defaults = sampling_defaults(ctx.component_dir())
        from worker.engines.sglang.engine import EngineSettings, SGLangEngine

        self.engine = SGLangEngine(EngineSettings.of_stage(ctx))
        # SGLang has no suppressed-token list: the checkpoint's go in as a -inf bias
        self.suppress = tuple((t, float("-inf")) for t in stops.suppress)
        self.reqs: dict[str, _Request] = {}
        self._refused: list[Output] = []  # requests refused at start, reported by the next step

    def warmup(self) -> None:
        meta = RequestMeta("chat", frozenset({"text"}), max_tokens=2)
        self.start("warmup", meta, {"in": PromptIds([0, 1, 2])})
        while self.reqs:
            self.step()

    # ---- interface -------------------------------------------------------------------------
    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        ids = [int(t) for t in input_of(inputs, PromptIds).input_ids]
        eng = self.ctx.stage.engine
        try:
            check_prompt(len(ids), eng.context_length, self.ctx.kv_tokens)
        except ValueError as exc:
            self._refused.append((INVALID, rid, f"{self.ctx.name}: {exc}"))
            return
        self.reqs[rid] = _Request(len(ids))
        self.engine.submit(
            EngineRequest(
                rid,
                ids,
                max_new_tokens=reply_budget(eng, meta.max_tokens, len(ids)),
                sampling=(meta.sampling or Sampling()).under(self.defaults, self.suppress),
                stop_token_ids=self.eos,
                logprobs=meta.logprobs,
                grammar=meta.grammar,
            )
        )

    def abort(self, rid: str) -> None:
        if self.reqs.pop(rid, None) is not None:
            self.engine.abort(rid)

    def next_deadline(self) -> float | None:
        return 0.0 if self._refused or self.engine.has_work() else None

    def queue_depth(self) -> int:
        return self.engine.queue_depth()

    def step(self) -> list[Output]:
        outs, self._refused = list(self._refused), []
        for ev in self.engine.step():
            r = self.reqs.get(ev.rid)
            if r is not None:
                outs += self._on_event(ev.rid, r, ev)
        return outs

    # ---- internals ---------------------------------------------------------------------------
    def _on_event(self, rid: str, r: _Request, ev: EngineEvent) -> list[Output]:
        if ev.finish == "abort":
            self.reqs.pop(rid, None)
            return [(INVALID, rid, f"{self.ctx.name}: {ev.error}")]
        outs: list[Output] = []
        tokens, logprobs = ev.reply(self.eos)
        for k, token in enumerate(tokens):
            piece = TokenPiece([token])
            if not r.started and k == 0:
                piece.prompt_tokens, piece.cached_tokens = r.prompt_len, ev.cached_tokens
            if logprobs:
                piece.logprobs = [(logprobs[k].logprob, list(logprobs[k].top))]
            outs.append((CHUNK, rid, piece))
        r.started = r.started or bool(outs)
        r.generated += len(outs)
        if ev.finish is not None:
            self.reqs.pop(rid, None)
            info = {
                "finish_reason": ev.finish,
                "prompt_tokens": r.prompt_len,
                "completion_tokens": r.generated,
                "cached_tokens": ev.cached_tokens,
            }
            outs += [(END, rid, info), (DONE, rid, info)]
        return outs
