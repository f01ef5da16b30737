"""Qwen3-Omni's thinker: the MoE language model, batched at the step level.

Prefill follows the real model: token embeddings with the encoders' outputs scattered in at
their placeholders, the vision encoder's deepstack features added in the first layers, and the
3-D (temporal, height, width) rope positions of ``get_rope_index``; decode steps then advance
every running request by one token (left-padded KV batch, see ``worker.stages.kvbatch``), each
at its own ``position + rope delta``. Tokens stream to decode; with speech output the talker
also gets what it is built on: the prompt's embeddings and its hidden states at the talker's
``accept_hidden_layer``, then each new token's embedding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from worker.models.qwen3_omni.common import check_prompt, load, on_device
from worker.stages.base import CHUNK, DONE, END, INVALID, Output, RequestMeta, StageExecutor
from worker.stages.generation_config import stop_tokens
from worker.stages.grammar import GrammarBackend, Matcher
from worker.stages.kvbatch import KVBatch
from worker.stages.sampling import SamplerState, Sampling, logprobs, pick


@dataclass(slots=True)
class _Request:
    rid: str
    meta: RequestMeta
    payload: dict[str, Any]
    max_new: int
    pos: int = 0  # text position of the next input
    delta: int = 0  # rope position minus text position (multimodal prompts compress positions)
    generated: int = 0
    last: int = -1
    prompt_len: int = 0
    forced: list[int] | None = None
    to_talker: bool = False
    sampler: SamplerState = field(default_factory=lambda: SamplerState(Sampling()))
    matcher: Matcher | None = None  # its response_format's grammar, when it has one
    extra: dict[str, Any] = field(default_factory=dict)


class ThinkerExecutor(StageExecutor):
    def load(self) -> None:
        import torch

        self.torch = torch
        self.config, self.thinker = load(self.ctx)
        self.lm = self.thinker.model.language_model
        self.embed = self.lm.embed_tokens
        tc = self.config.thinker_config
        self.audio_id, self.image_id = tc.audio_token_id, tc.image_token_id
        self.video_id = tc.video_token_id
        # the checkpoint's generation config (eos list, suppressed tokens), and <|im_end|>
        stops = stop_tokens(
            self.ctx.component_dir(),
            getattr(tc.text_config, "eos_token_id", None),
            (self.config.im_end_token_id,),
        )
        self.eos = set(stops.eos)
        vocab = self.thinker.lm_head.weight.shape[0]
        self.suppress = (
            stops.suppress_mask(torch, vocab, self.ctx.device) if stops.suppress else None
        )
        self.accept = self.config.talker_config.accept_hidden_layer
        self.tts_ids = [
            self.config.tts_bos_token_id,
            self.config.tts_eos_token_id,
            self.config.tts_pad_token_id,
        ]
        self.engine = self.ctx.stage.engine
        self.pending: list[_Request] = []
        self.running: dict[str, _Request] = {}
        self.batch = KVBatch()
        self.deltas: Any = None  # rope deltas of the batch rows, for the decode adapter
        self.grammar_backend: GrammarBackend | None = None

    def warmup(self) -> None:
        meta = RequestMeta("chat", frozenset({"text"}), max_tokens=2)
        self.start("warmup", meta, {"preprocessing": {"input_ids": [0, 1, 2], "audio_lens": []}})
        while self.pending or self.running:
            self.step()

    # ---- interface -------------------------------------------------------------------------
    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        payload: dict[str, Any] = {}
        for src in sorted(inputs):
            payload.update(inputs[src])
        limit = self.engine.max_new_tokens
        if meta.max_tokens is not None:
            limit = min(limit, meta.max_tokens)
        r = _Request(rid, meta, payload, max_new=max(1, limit), forced=payload.get("forced_ids"))
        r.sampler = SamplerState.of(meta.sampling, payload["input_ids"])
        if meta.grammar is not None:
            r.matcher = self._grammars().matcher(meta.grammar)
        r.to_talker = "talker" in meta.stream_targets
        self.pending.append(r)

    def abort(self, rid: str) -> None:
        self.pending = [r for r in self.pending if r.rid != rid]
        if self.running.pop(rid, None) is not None:
            self.batch.leave({rid})

    def next_deadline(self) -> float | None:
        if self.pending and len(self.running) < self.ctx.max_running_requests:
            return 0.0
        return 0.0 if self.running else None

    def queue_depth(self) -> int:
        return len(self.pending) + len(self.running)

    def step(self) -> list[Output]:
        outs: list[Output] = []
        with self.torch.inference_mode():
            budget = self.engine.prefill_chunk_tokens
            while self.pending and len(self.running) < self.ctx.max_running_requests:
                r = self.pending[0]
                n = len(r.payload["input_ids"])
                if self.running and n > budget:
                    break  # long prompts wait for the next step so running decodes keep flowing
                if self.running and not self._kv_room(n):
                    break  # waits for room in the plan's KV pool
                self.pending.pop(0)
                budget -= n
                try:
                    outs += self._prefill(r)
                except ValueError as exc:
                    outs.append((INVALID, r.rid, f"{self.ctx.name}: {exc}"))
            if self.running:
                outs += self._decode()
        return outs

    def _kv_room(self, n: int) -> bool:
        """One more row of a prompt of ``n`` tokens fits the plan's KV pool (``kv_tokens``; the
        left-padded batch holds rows x its longest row)."""
        kv = self.ctx.kv_tokens
        width = max(self.batch.mask.shape[1] if self.batch.mask is not None else 0, n)
        return not kv or (len(self.batch) + 1) * width <= kv

    # ---- prefill ---------------------------------------------------------------------------
    def _prefill(self, r: _Request) -> list[Output]:
        torch = self.torch
        dev = self.ctx.device
        p = r.payload
        ids = torch.tensor([p["input_ids"]], device=dev)
        n = ids.shape[1]
        check_prompt(n, self.engine.context_length, self.ctx.kv_tokens)
        r.max_new = min(r.max_new, self.engine.context_length - n)
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
            output_hidden_states=r.to_talker,
            deepstack_visual_embeds=deepstack,
            visual_pos_masks=visual_mask,
        )
        r.pos, r.delta, r.prompt_len = n, int(deltas.view(-1)[0]), n
        first: dict[str, Any] = {"prompt_tokens": n}  # (decode's usage if a stop string ends it)
        if r.to_talker:
            tts = self.embed(torch.tensor([self.tts_ids], device=dev))[0]
            first = {
                **first,
                "prompt_embed": embeds[0],
                "prompt_hidden": out.hidden_states[self.accept][0],
                "tts_embeds": tts,
            }
        if r.forced is not None:  # speech: the reply is given; stream it, generate nothing
            return self._forced(r, first)
        token = self._pick(self.thinker.lm_head(out.last_hidden_state[:, -1]), [r])[0]
        first = {**first, **r.extra.pop("logprobs", {})}
        self.running[r.rid] = r
        self.batch.join(r.rid, out.cache, n)
        outs = self._on_token(r, token, first)
        if r.rid not in self.running:  # stopped at its first token
            self.batch.leave({r.rid})
        return outs

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

    def _forced(self, r: _Request, first: dict[str, Any]) -> list[Output]:
        tokens = list(r.forced or [])
        data = {"tokens": tokens, **first}
        if r.to_talker:
            data["embeds"] = self.embed(self.torch.tensor([tokens], device=self.ctx.device))[0]
        r.generated = len(tokens)
        info = self._info(r, "stop")
        return [(CHUNK, r.rid, data), (END, r.rid, info), (DONE, r.rid, info)]

    # ---- decode ----------------------------------------------------------------------------
    def _decode(self) -> list[Output]:
        torch = self.torch
        rows = [self.running[rid] for rid in self.batch.rids]
        dev = self.ctx.device
        embeds = self.embed(torch.tensor([[r.last] for r in rows], device=dev))
        positions = torch.tensor([r.pos for r in rows], device=dev)
        self.deltas = torch.tensor([r.delta for r in rows], device=dev)
        valid = torch.ones(len(rows), dtype=torch.bool, device=dev)
        logits, _ = self.batch.step(self._forward, embeds, valid, positions, False)
        outs: list[Output] = []
        done: set[str] = set()
        for r, token in zip(rows, self._pick(logits, rows), strict=True):
            r.pos += 1
            outs += self._on_token(r, token, r.extra.pop("logprobs", {}))
            if r.rid not in self.running:
                done.add(r.rid)
        if done:
            self.batch.leave(done)
        return outs

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
        asked = [i for i, r in enumerate(rows) if r.meta.logprobs is not None]
        if asked:  # the chosen token's log probability and its rivals', for decode
            top = max(rows[i].meta.logprobs or 0 for i in asked)
            found = logprobs(self.torch, logits[asked], [tokens[i] for i in asked], top)
            for i, (lp, alts) in zip(asked, found, strict=True):
                n = rows[i].meta.logprobs or 0
                rows[i].extra["logprobs"] = {"logprobs": [(lp, alts[:n])]}
        return tokens

    def _on_token(self, r: _Request, token: int, first: dict[str, Any]) -> list[Output]:
        if token in self.eos or (r.matcher is not None and r.matcher.done):
            # (its log probability has no text to go with; a grammar ends on a stop token)
            return self._stop(r, "stop", {k: v for k, v in first.items() if k != "logprobs"})
        r.sampler.add(token)
        r.generated += 1
        r.last = token
        data: dict[str, Any] = {"tokens": [token], **first}
        if r.to_talker:
            data["embeds"] = self.embed(self.torch.tensor([[token]], device=self.ctx.device))[0]
        outs: list[Output] = [(CHUNK, r.rid, data)]
        if r.generated >= r.max_new:
            outs += self._stop(r, "length", {})
        return outs

    def _stop(self, r: _Request, reason: str, first: dict[str, Any]) -> list[Output]:
        self.running.pop(r.rid, None)
        info = self._info(r, reason)
        outs: list[Output] = []
        if first:  # stopped at its first token: the talker still needs the prompt
            outs.append((CHUNK, r.rid, {"tokens": [], **first}))
        return [*outs, (END, r.rid, info), (DONE, r.rid, info)]

    def _info(self, r: _Request, reason: str) -> dict[str, Any]:
        return {
            "finish_reason": reason,
            "prompt_tokens": r.prompt_len,
            "completion_tokens": r.generated,
        }
