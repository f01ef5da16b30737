"""The project's own engine (``engine.backend: transformers``): a transformers causal language
model batched at the step level, behind the engine interface (``worker.engines.base``) that
SGLang's scheduler also serves.

Each step admits waiting requests within ``max_running_requests`` and the plan's KV pool,
prefills each one whole (a prompt longer than ``prefill_chunk_tokens`` waits until nothing
runs, so running decodes keep flowing), then advances every running request by one token in
one forward over a left-padded cache (``worker.stages.kvbatch``). Tokens are picked as each
request asks (``worker.stages.sampling``), within its grammar, with their log probabilities when
asked; the checkpoint's suppressed tokens are masked first. No prefix cache (``cached_tokens``
is 0). A family whose prompts carry more than token ids (the Qwen3-Omni thinker: the encoders'
outputs, 3-D rope positions) overrides ``_prefill_forward`` and ``_decode_forward``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from worker.engines.base import EngineEvent, EngineRequest, ForwardTrace, TokenLogprob
from worker.stages.base import StageContext
from worker.stages.grammar import GrammarBackend, Matcher
from worker.stages.kvbatch import KVBatch
from worker.stages.sampling import SamplerState, Sampling, logprobs, pick


@dataclass(slots=True)
class LMRequest:
    req: EngineRequest
    pos: int = 0  # text position of the next input
    delta: int = 0  # rope position minus text position (multimodal prompts compress positions)
    generated: int = 0
    last: int = -1
    sampler: SamplerState = field(default_factory=lambda: SamplerState(Sampling()))
    matcher: Matcher | None = None  # its response_format's grammar, when it has one
    logprob: TokenLogprob | None = None  # of the token just picked, when asked

    @property
    def rid(self) -> str:
        return self.req.rid


class TorchLMEngine:
    """``model`` maps ``inputs_embeds`` (with ``cache``, ``attention_mask``, ``position_ids``)
    to ``logits`` and ``cache``, as transformers' causal LMs do; ``suppress`` masks the
    checkpoint's suppressed tokens (None: none)."""

    def __init__(
        self,
        ctx: StageContext,
        model: Any,
        embed: Any,
        vocab_size: int,
        suppress: Any = None,
        on_forward: Callable[[ForwardTrace], None] | None = None,
    ) -> None:
        import torch

        self.torch = torch
        self.ctx = ctx
        self.model = model
        self.embed = embed
        self.vocab_size = vocab_size
        self.suppress = suppress
        self.on_forward = on_forward
        self.settings = ctx.stage.engine
        self.pending: list[LMRequest] = []
        self.running: dict[str, LMRequest] = {}
        self.batch = KVBatch()
        self.deltas: Any = None  # rope deltas of the batch rows, for a family's decode forward
        self.grammar_backend: GrammarBackend | None = None

    # ---- the engine interface ----------------------------------------------------------------
    def submit(self, request: EngineRequest) -> None:
        r = LMRequest(request, sampler=SamplerState.of(request.sampling, request.input_ids))
        if request.grammar is not None:
            r.matcher = self._grammars().matcher(request.grammar)
        self.pending.append(r)

    def abort(self, rid: str) -> None:
        self.pending = [r for r in self.pending if r.rid != rid]
        if self.running.pop(rid, None) is not None:
            self.batch.leave({rid})

    def has_work(self) -> bool:
        return bool(self.running) or (
            bool(self.pending) and len(self.running) < self.ctx.max_running_requests
        )

    def queue_depth(self) -> int:
        return len(self.pending) + len(self.running)

    def step(self) -> list[EngineEvent]:
        events: list[EngineEvent] = []
        with self.torch.inference_mode():
            budget = self.settings.prefill_chunk_tokens
            while self.pending and len(self.running) < self.ctx.max_running_requests:
                r = self.pending[0]
                n = len(r.req.input_ids)
                if self.running and n > budget:
                    break  # long prompts wait for the next step so running decodes keep flowing
                if self.running and not self.batch.fits(n, self.ctx.kv_tokens):
                    break  # waits for room in the plan's KV pool
                self.pending.pop(0)
                budget -= n
                try:
                    events.append(self._prefill(r))
                except ValueError as exc:
                    events.append(EngineEvent(r.rid, finish="abort", error=str(exc)))
            if self.running:
                events += self._decode()
        return events

    # ---- what a family overrides -------------------------------------------------------------
    def _prefill_forward(self, r: LMRequest) -> tuple[Any, Any]:
        """The prompt's forward: its last position's logits (1 x vocab) and its cache; sets
        ``r.delta`` where rope positions differ from text positions."""
        ids = self.torch.tensor([r.req.input_ids], device=self.ctx.device)
        out = self.model(inputs_embeds=self.embed(ids), use_cache=True)
        if self.on_forward is not None:
            self.on_forward(ForwardTrace([r.rid], [ids.shape[1]], True))
        return out.logits[:, -1], out.cache

    def _decode_forward(
        self, inputs_embeds: Any, attention_mask: Any, position_ids: Any, cache: Any, **_: Any
    ) -> Any:
        """One decode step of the batch, in the form ``KVBatch.step`` calls its model."""
        return self.model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=True,
        )

    # ---- internals ---------------------------------------------------------------------------
    def _prefill(self, r: LMRequest) -> EngineEvent:
        logits, cache = self._prefill_forward(r)
        r.pos = len(r.req.input_ids)
        token = self._pick(logits, [r])[0]
        self.running[r.rid] = r
        self.batch.join(r.rid, cache, r.pos)
        event = self._on_token(r, token)
        if r.rid not in self.running:  # stopped at its first token
            self.batch.leave({r.rid})
        return event

    def _decode(self) -> list[EngineEvent]:
        torch = self.torch
        rows = [self.running[rid] for rid in self.batch.rids]
        dev = self.ctx.device
        embeds = self.embed(torch.tensor([[r.last] for r in rows], device=dev))
        positions = torch.tensor([r.pos for r in rows], device=dev)
        self.deltas = torch.tensor([r.delta for r in rows], device=dev)
        valid = torch.ones(len(rows), dtype=torch.bool, device=dev)
        logits, _ = self.batch.step(self._decode_forward, embeds, valid, positions, False)
        events: list[EngineEvent] = []
        done: set[str] = set()
        for r, token in zip(rows, self._pick(logits, rows), strict=True):
            r.pos += 1
            events.append(self._on_token(r, token))
            if r.rid not in self.running:
                done.add(r.rid)
        if done:
            self.batch.leave(done)
        return events

    def _grammars(self) -> GrammarBackend:
        """The grammar compiler over this checkpoint's tokenizer (built on first use)."""
        if self.grammar_backend is None:
            self.grammar_backend = GrammarBackend(self.ctx.checkpoint, self.vocab_size)
        return self.grammar_backend

    def _pick(self, logits: Any, rows: list[LMRequest]) -> list[int]:
        logits = logits.float()
        if self.suppress is not None:
            logits = logits.masked_fill(self.suppress[: logits.shape[-1]], float("-inf"))
        constrained = [i for i, r in enumerate(rows) if r.matcher is not None]
        if constrained:
            logits = logits.clone()
            for i in constrained:
                logits[i] = rows[i].matcher.mask(logits[i])  # type: ignore[union-attr]
        tokens = pick(self.torch, logits, [r.sampler for r in rows])
        for i in constrained:
            rows[i].matcher.accept(tokens[i])  # type: ignore[union-attr]
        asked = [i for i, r in enumerate(rows) if r.req.logprobs is not None]
        if asked:  # the chosen token's log probability and its rivals'
            top = max(rows[i].req.logprobs or 0 for i in asked)
            found = logprobs(self.torch, logits[asked], [tokens[i] for i in asked], top)
            for i, (lp, alts) in zip(asked, found, strict=True):
                n = rows[i].req.logprobs or 0
                rows[i].logprob = TokenLogprob(lp, tuple(alts[:n]))
        return tokens

    def _on_token(self, r: LMRequest, token: int) -> EngineEvent:
        """The event of the token just picked: a stop token ends the request (and goes out, as
        SGLang sends it), as does a grammar that is done (the token not sent)."""
        lp = [r.logprob] if r.logprob is not None else []
        r.logprob = None
        if token in r.req.stop_token_ids:
            self.running.pop(r.rid, None)
            return EngineEvent(r.rid, [token], lp, finish="stop")
        if r.matcher is not None and r.matcher.done:
            self.running.pop(r.rid, None)
            return EngineEvent(r.rid, finish="stop")
        r.sampler.add(token)
        r.generated += 1
        r.last = token
        if r.generated >= r.req.max_new_tokens:
            self.running.pop(r.rid, None)
            return EngineEvent(r.rid, [token], lp, finish="length")
        return EngineEvent(r.rid, [token], lp)
