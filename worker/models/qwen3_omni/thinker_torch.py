"""The project's own engine under the Qwen3-Omni thinker (``engine.backend: transformers``):
transformers' MoE language model batched at the step level, behind the engine interface
(``worker.engines.base.Engine``) that SGLang's scheduler also serves.

Prefill follows the real model: token embeddings with the encoders' outputs scattered in at
their placeholders, the vision encoder's deepstack features added in the first layers, and the
3-D (temporal, height, width) rope positions of ``get_rope_index``; decode steps then advance
every running request by one token (left-padded KV batch, see ``worker.stages.kvbatch``), each
at its own ``position + rope delta``. Requests are admitted within the plan's KV pool and
``max_running_requests``; a prompt longer than ``prefill_chunk_tokens`` waits until nothing
runs, so running decodes keep flowing. No prefix cache (``cached_tokens`` is 0). While
``capture`` is set, a prefill also keeps the prompt's hidden states at the talker's
``accept_hidden_layer`` in ``captured`` for the ``on_forward`` callback, as the SGLang model
class does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from worker.engines.base import EngineEvent, EngineRequest, ForwardTrace, TokenLogprob
from worker.models.qwen3_omni.common import load, on_device
from worker.stages.base import StageContext
from worker.stages.generation_config import stop_tokens
from worker.stages.grammar import GrammarBackend, Matcher
from worker.stages.kvbatch import KVBatch
from worker.stages.sampling import SamplerState, Sampling, logprobs, pick


@dataclass(slots=True)
class _Request:
    req: EngineRequest
    payload: dict[str, Any]  # the encoders' outputs, grids and lengths ({}: a text prompt)
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


class TorchThinkerEngine:
    def __init__(
        self, ctx: StageContext, on_forward: Callable[[ForwardTrace], None] | None = None
    ) -> None:
        import torch

        self.torch = torch
        self.ctx = ctx
        self.on_forward = on_forward
        self.config, self.thinker = load(ctx)
        self.lm = self.thinker.model.language_model
        self.embed = self.lm.embed_tokens
        tc = self.config.thinker_config
        self.audio_id, self.image_id = tc.audio_token_id, tc.image_token_id
        self.video_id = tc.video_token_id
        # the checkpoint's suppressed tokens, masked before the sampler and the log
        # probabilities (the executor's stop tokens come with each request)
        stops = stop_tokens(ctx.component_dir(), getattr(tc.text_config, "eos_token_id", None), ())
        vocab = self.thinker.lm_head.weight.shape[0]
        self.suppress = stops.suppress_mask(torch, vocab, ctx.device) if stops.suppress else None
        self.accept = self.config.talker_config.accept_hidden_layer
        self.settings = ctx.stage.engine
        self.pending: list[_Request] = []
        self.running: dict[str, _Request] = {}
        self.batch = KVBatch()
        self.deltas: Any = None  # rope deltas of the batch rows, for the decode adapter
        self.grammar_backend: GrammarBackend | None = None
        self.capture = False  # set by the stage before a step whose prompts a talker needs
        self.captured: Any = None  # the last prefill's hidden states at ``accept``

    # ---- the engine interface ----------------------------------------------------------------
    def submit(self, request: EngineRequest) -> None:
        r = _Request(request, request.multimodal or {})
        r.sampler = SamplerState.of(request.sampling, request.input_ids)
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

    # ---- prefill ---------------------------------------------------------------------------
    def _prefill(self, r: _Request) -> EngineEvent:
        torch = self.torch
        dev = self.ctx.device
        p = r.payload
        ids = torch.tensor([r.req.input_ids], device=dev)
        n = ids.shape[1]
        embeds = self.embed(ids)
        embeds = self._scatter(embeds, ids == self.audio_id, p.get("audio_embeds"), "audio")
        image_mask, video_mask = ids == self.image_id, ids == self.video_id
        embeds = self._scatter(embeds, image_mask, p.get("image_embeds"), "image")
        embeds = self._scatter(embeds, video_mask, p.get("video_embeds"), "video")
        visual_mask, deepstack = self._deepstack(p, image_mask[0], video_mask[0], embeds.dtype)
        lens = p.get("audio_lens") or None
        image_grid, video_grid = p.get("image_grid"), p.get("video_grid")
        positions, deltas = self.thinker.model.get_rope_index(
            ids,
            image_grid_thw=torch.from_numpy(image_grid).to(dev) if image_grid is not None else None,
            video_grid_thw=torch.from_numpy(video_grid).to(dev) if video_grid is not None else None,
            attention_mask=torch.ones_like(ids),
            audio_seqlens=torch.tensor(lens, device=dev) if lens else None,
            second_per_grids=torch.tensor(p["video_seconds"], device=dev)
            if video_grid is not None
            else None,
        )
        text_pos = torch.arange(n, device=dev).view(1, 1, n)
        out = self.lm(
            inputs_embeds=embeds,
            position_ids=torch.cat([text_pos, positions]),
            use_cache=True,
            output_hidden_states=self.capture,
            deepstack_visual_embeds=deepstack,
            visual_pos_masks=visual_mask,
        )
        if self.on_forward is not None:
            self.captured = out.hidden_states[self.accept][0] if self.capture else None
            self.on_forward(ForwardTrace([r.rid], [n], True))
        r.pos, r.delta = n, int(deltas.view(-1)[0])
        token = self._pick(self.thinker.lm_head(out.last_hidden_state[:, -1]), [r])[0]
        self.running[r.rid] = r
        self.batch.join(r.rid, out.cache, n)
        event = self._on_token(r, token)
        if r.rid not in self.running:  # stopped at its first token
            self.batch.leave({r.rid})
        return event

    def _deepstack(
        self, p: dict[str, Any], image_mask: Any, video_mask: Any, dtype: Any
    ) -> tuple[Any, Any]:
        """The vision encoder's deepstack features at the visual positions (images and video
        frames in prompt order), added to the first decoder layers' hidden states."""
        torch = self.torch
        image, video = p.get("image_deepstack"), p.get("video_deepstack")
        present = [d for d in (image, video) if d is not None]
        if not present:
            return None, None
        visual = image_mask | video_mask
        layers = []
        for i in range(len(present[0])):
            joint = torch.zeros(
                int(visual.sum()), self.embed.weight.shape[1], dtype=dtype, device=visual.device
            )
            if image is not None:
                joint[image_mask[visual]] = on_device(image[i], joint.device, joint.dtype)
            if video is not None:
                joint[video_mask[visual]] = on_device(video[i], joint.device, joint.dtype)
            layers.append(joint)
        return visual[None], layers

    def _scatter(self, embeds: Any, mask: Any, values: Any, what: str) -> Any:
        if values is None:
            if bool(mask.any()):
                raise ValueError(f"the prompt has {what} placeholders but no {what} input")
            return embeds
        values = on_device(values, embeds.device, embeds.dtype)
        if int(mask.sum()) != values.shape[0]:
            raise ValueError(
                f"{int(mask.sum())} {what} placeholders for {values.shape[0]} embeddings"
            )
        return embeds.masked_scatter(mask[..., None].expand_as(embeds), values)

    # ---- decode ----------------------------------------------------------------------------
    def _decode(self) -> list[EngineEvent]:
        torch = self.torch
        rows = [self.running[rid] for rid in self.batch.rids]
        dev = self.ctx.device
        embeds = self.embed(torch.tensor([[r.last] for r in rows], device=dev))
        positions = torch.tensor([r.pos for r in rows], device=dev)
        self.deltas = torch.tensor([r.delta for r in rows], device=dev)
        valid = torch.ones(len(rows), dtype=torch.bool, device=dev)
        logits, _ = self.batch.step(self._forward, embeds, valid, positions, False)
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

    def _forward(
        self, inputs_embeds: Any, attention_mask: Any, position_ids: Any, cache: Any, **_: Any
    ) -> Any:
        """One decode step in the shape KVBatch expects: text positions for the mask, rope
        positions shifted by each row's delta."""
        rope = (position_ids + self.deltas[:, None])[None].expand(3, -1, -1)
        out = self.lm(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=self.torch.cat([position_ids[None], rope]),
            cache=cache,
            use_cache=True,
        )
        return SimpleNamespace(logits=self.thinker.lm_head(out.last_hidden_state), cache=out.cache)

    def _grammars(self) -> GrammarBackend:
        """The grammar compiler over this checkpoint's tokenizer (built on first use)."""
        if self.grammar_backend is None:
            vocab = self.thinker.lm_head.weight.shape[0]
            self.grammar_backend = GrammarBackend(self.ctx.checkpoint, vocab)
        return self.grammar_backend

    def _pick(self, logits: Any, rows: list[_Request]) -> list[int]:
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

    def _on_token(self, r: _Request, token: int) -> EngineEvent:
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
