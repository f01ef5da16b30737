"""The project's own engine under Qwen3-ASR's ``asr`` stage (``engine.backend: transformers``):
the audio encoder and the Qwen3 decoder of ``modeling``, behind the engine interface
(``worker.engines.base.Engine``) that SGLang's scheduler also serves. Each request is one clip:
its prompt embedded with the clip's audio encoded in at the placeholders, then every running
clip advances one token per step (a KV cache per clip); at most ``max_running_requests`` run,
the rest wait in order. No prefix cache.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from worker.engines.base import EngineEvent, EngineRequest
from worker.models.stage_weights import torch_dtype
from worker.stages.base import StageContext
from worker.stages.sampling import SamplerState, Sampling, pick


@dataclass(slots=True)
class _Request:
    req: EngineRequest
    cache: Any = None
    hidden: Any = None  # the decoder's last output (1, 1, H)
    tokens: list[int] = field(default_factory=list)
    sampler: SamplerState = field(default_factory=lambda: SamplerState(Sampling()))

    @property
    def rid(self) -> str:
        return self.req.rid


class TorchASREngine:
    def __init__(self, ctx: StageContext) -> None:
        import torch

        from worker.models.qwen3_asr.modeling import Qwen3ASRModel
        from worker.models.qwen3_tts.weights import load_stage_weights

        self.torch = torch
        self.ctx = ctx
        ck = ctx.checkpoint
        config = json.loads((ck / "config.json").read_text())
        with torch.device("meta"):
            model = Qwen3ASRModel(config)
        dtype = torch_dtype(ctx.stage.dtype)
        load_stage_weights(model, ctx, ck, dtype=dtype, component=ctx.stage.component)
        self.model = model.eval()
        self.audio_id = config["thinker_config"]["audio_token_id"]
        self.waiting: list[_Request] = []
        self.running: list[_Request] = []

    # ---- the engine interface ----------------------------------------------------------------
    def submit(self, request: EngineRequest) -> None:
        r = _Request(request)
        r.sampler = SamplerState.of(request.sampling, request.input_ids)
        self.waiting.append(r)

    def abort(self, rid: str) -> None:
        self.waiting = [r for r in self.waiting if r.rid != rid]
        self.running = [r for r in self.running if r.rid != rid]

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def queue_depth(self) -> int:
        return len(self.waiting) + len(self.running)

    def step(self) -> list[EngineEvent]:
        """Start waiting clips (each picks its first token from its prompt), then advance every
        running clip by one token in one batch."""
        torch = self.torch
        tokens: dict[str, list[int]] = {}
        ended: dict[str, str] = {}
        with torch.inference_mode():
            while self.waiting and len(self.running) < self.ctx.max_running_requests:
                r = self.waiting.pop(0)
                self._prefill(r)
                self.running.append(r)
                self._pick([r], tokens, ended)
            live = [r for r in self.running if r.rid not in ended]
            if live:
                th = self.model.thinker
                x = th.model.embed_tokens(
                    torch.tensor([[r.tokens[-1]] for r in live], device=self.ctx.device)
                )
                h = th.model.step(x, [r.cache for r in live])
                for i, r in enumerate(live):
                    r.hidden = h[i : i + 1]
                self._pick(live, tokens, ended)
        self.running = [r for r in self.running if r.rid not in ended]
        return [EngineEvent(rid, new, finish=ended.get(rid)) for rid, new in tokens.items()]

    def _pick(
        self, rows: list[_Request], tokens: dict[str, list[int]], ended: dict[str, str]
    ) -> None:
        torch = self.torch
        h = torch.cat([r.hidden for r in rows])[:, -1]
        logits = self.model.thinker.logits(h).float()
        for r, t in zip(rows, pick(torch, logits, [r.sampler for r in rows]), strict=True):
            r.sampler.add(t)  # (greedy: the argmax)
            r.tokens.append(t)
            tokens.setdefault(r.rid, []).append(t)
            if t in r.req.stop_token_ids:
                ended[r.rid] = "stop"
            elif len(r.tokens) >= r.req.max_new_tokens:
                ended[r.rid] = "length"

    def _prefill(self, r: _Request) -> None:
        from worker.models.qwen3_tts.modeling import KVCache

        torch = self.torch
        th = self.model.thinker
        ids = torch.tensor([r.req.input_ids], device=self.ctx.device)
        x = th.model.embed_tokens(ids)
        audio = th.audio_tower(r.req.multimodal.to(self.ctx.device, x.dtype))
        x[0, ids[0] == self.audio_id] = audio.to(x.dtype)
        r.cache = KVCache.empty(th.model.s.num_layers)
        r.hidden = th.model.prefill(x, r.cache)[:, -1:]
