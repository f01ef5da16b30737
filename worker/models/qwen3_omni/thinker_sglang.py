"""Qwen3-Omni's thinker on SGLang (``engine.backend: sglang``): the same stage protocol as
``thinker.ThinkerExecutor``, with SGLang's scheduler under it (``worker.engines.sglang``).

What SGLang does here: the paged KV pool (sized by the plan), the radix prefix cache (a turn
that repeats an earlier prompt's start computes only what is new; ``cached_tokens`` says how
much was reused), chunked prefill mixed with the running decodes, the sampler (every OpenAI
sampling field, seeds included), log probabilities and constrained decoding (xgrammar).

What stays the project's: the encoders' outputs come from the encoder stages and enter as
SGLang's precomputed multimodal embeddings, one item per clip or image, keyed by a hash of
its content (so an image repeated in a later turn matches the cached prefix); the 3-D rope
positions come from SGLang's own ``get_rope_index_qwen3_omni``; tokens stream to decode as they
come; with speech output the talker gets the prompt's embeddings and its hidden states at the
talker's ``accept_hidden_layer`` (captured by ``worker.engines.sglang.models.Qwen3OmniThinker``
during the prompt's prefill forwards), then each new token's embedding. A request whose prompt
a talker needs is computed whole (``private_prefix``): a cached prefix has no hidden states to
give again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from worker.engines.base import EngineEvent, EngineRequest
from worker.engines.sglang.engine import ForwardTrace
from worker.models.qwen3_omni.common import check_prompt, on_device
from worker.stages.base import CHUNK, DONE, END, INVALID, Output, RequestMeta, StageExecutor
from worker.stages.generation_config import stop_tokens
from worker.stages.sampling import Sampling


@dataclass(slots=True)
class _Request:
    rid: str
    meta: RequestMeta
    prompt_len: int
    forced: list[int] | None
    to_talker: bool
    generated: int = 0
    started: bool = False  # its first event (the prompt's) went out
    embeds: list[Any] = field(default_factory=list)  # captured prompt pieces, for the talker
    hidden: list[Any] = field(default_factory=list)


class SGLangThinkerExecutor(StageExecutor):
    def load(self) -> None:
        import torch
        from transformers import Qwen3OmniMoeConfig

        from worker.engines.sglang.engine import EngineSettings, SGLangEngine

        self.torch = torch
        ctx = self.ctx
        if ctx.stage.tp_size > 1:
            raise ValueError(f"stage {ctx.name}: tp_size {ctx.stage.tp_size} is not supported yet")
        self.config = Qwen3OmniMoeConfig.from_pretrained(ctx.checkpoint)
        tc: Any = self.config.thinker_config
        self.tc = tc
        stops = stop_tokens(
            ctx.component_dir(),
            getattr(tc.text_config, "eos_token_id", None),
            (self.config.im_end_token_id,),
        )
        self.eos = frozenset(stops.eos)
        # (SGLang has no suppressed-token list: the checkpoint's go in as a -inf bias)
        self.suppress = tuple((t, float("-inf")) for t in stops.suppress)
        self.tts_ids = [
            self.config.tts_bos_token_id,
            self.config.tts_eos_token_id,
            self.config.tts_pad_token_id,
        ]
        self.engine_settings = ctx.stage.engine
        self.engine = SGLangEngine(EngineSettings.of_stage(ctx), on_forward=self._on_forward)
        self.model = self.engine.model
        self.embed = self.model.thinker.model.embed_tokens
        self.reqs: dict[str, _Request] = {}
        self._refused: list[Output] = []  # requests refused at start, reported by the next step

    def warmup(self) -> None:
        meta = RequestMeta("chat", frozenset({"text"}), max_tokens=2)
        self.start("warmup", meta, {"preprocessing": {"input_ids": [0, 1, 2], "audio_lens": []}})
        while self.reqs:
            self.step()

    # ---- interface -------------------------------------------------------------------------
    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        payload: dict[str, Any] = {}
        for src in sorted(inputs):
            payload.update(inputs[src])
        ids = [int(t) for t in payload["input_ids"]]
        r = _Request(
            rid,
            meta,
            prompt_len=len(ids),
            forced=payload.get("forced_ids"),
            to_talker="talker" in meta.stream_targets,
        )
        self.reqs[rid] = r
        eng = self.engine_settings
        try:
            check_prompt(len(ids), eng.context_length, self.ctx.kv_tokens)
            multimodal = self._multimodal(ids, payload)
        except ValueError as exc:
            self.reqs.pop(rid)
            self._refused.append((INVALID, rid, f"{self.ctx.name}: {exc}"))
            return
        limit = eng.max_new_tokens if meta.max_tokens is None else meta.max_tokens
        limit = max(1, min(limit, eng.max_new_tokens, eng.context_length - len(ids)))
        sampling = meta.sampling or Sampling()
        if self.suppress:
            sampling = _with_bias(sampling, self.suppress)
        self.engine.submit(
            EngineRequest(
                rid,
                ids,
                # (a given reply generates nothing: one token, not used)
                max_new_tokens=1 if r.forced is not None else limit,
                sampling=sampling,
                stop_token_ids=self.eos,
                logprobs=meta.logprobs,
                grammar=meta.grammar,
                multimodal=multimodal,
                private_prefix=r.to_talker,
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
        self.model.capture = any(r.to_talker and not r.started for r in self.reqs.values())
        for ev in self.engine.step():
            r = self.reqs.get(ev.rid)
            if r is not None:
                outs += self._on_event(r, ev)
        return outs

    # ---- internals ---------------------------------------------------------------------------
    def _on_forward(self, trace: ForwardTrace) -> None:
        """After a prefill forward: each talker-bound request's share of the captured prompt
        embeddings and hidden states."""
        captured, self.model.captured = self.model.captured, None
        if captured is None or not trace.prefill:
            return
        embeds, hidden = captured
        at = 0
        for rid, n in zip(trace.rids, trace.lengths, strict=True):
            r = self.reqs.get(rid)
            if r is not None and r.to_talker and not r.started:
                r.embeds.append(embeds[at : at + n])
                r.hidden.append(hidden[at : at + n])
            at += n

    def _on_event(self, r: _Request, ev: EngineEvent) -> list[Output]:
        if ev.finish == "abort":
            self.reqs.pop(r.rid, None)
            return [(INVALID, r.rid, f"{self.ctx.name}: {ev.error}")]
        outs: list[Output] = []
        tokens, logprobs = ev.tokens, ev.logprobs
        if ev.finish == "stop" and tokens and tokens[-1] in self.eos:
            n = len(tokens) - 1  # (the stop token is not part of the reply)
            tokens, logprobs = tokens[:n], logprobs[:n]
        first: dict[str, Any] = {}
        if not r.started:
            r.started = True
            first = {"prompt_tokens": r.prompt_len, "cached_tokens": ev.cached_tokens}
            if r.to_talker:
                first.update(self._prompt_for_talker(r))
        if r.forced is not None:  # speech: the reply is given, streamed whole
            pieces: list[list[int]] = [list(r.forced)]
            logprobs = []
            ev.finish = "stop"
        else:  # one piece per token, as the torch engine streams them (docs/reliability.md)
            pieces = [[t] for t in tokens]
        if first and not pieces:
            pieces = [[]]  # the prompt's data goes out even when no token came with it
        for k, piece in enumerate(pieces):
            data: dict[str, Any] = {"tokens": piece, **(first if k == 0 else {})}
            if logprobs:
                lp = logprobs[k]
                data["logprobs"] = [(lp.logprob, list(lp.top))]
            if r.to_talker:
                ids = self.torch.tensor([piece], dtype=self.torch.long, device=self.ctx.device)
                data["embeds"] = self.embed(ids)[0]
            r.generated += len(piece)
            outs.append((CHUNK, r.rid, data))
        if ev.finish is not None:
            self.reqs.pop(r.rid, None)
            info = {
                "finish_reason": ev.finish,
                "prompt_tokens": r.prompt_len,
                "completion_tokens": r.generated,
                "cached_tokens": ev.cached_tokens,
            }
            outs += [(END, r.rid, info), (DONE, r.rid, info)]
        return outs

    def _prompt_for_talker(self, r: _Request) -> dict[str, Any]:
        torch = self.torch
        embeds, hidden = torch.cat(r.embeds), torch.cat(r.hidden)
        r.embeds, r.hidden = [], []
        if embeds.shape[0] != r.prompt_len:
            raise RuntimeError(
                f"{self.ctx.name}: captured {embeds.shape[0]} of {r.prompt_len} prompt positions"
            )
        tts = self.embed(torch.tensor(self.tts_ids, device=self.ctx.device))
        return {"prompt_embed": embeds, "prompt_hidden": hidden, "tts_embeds": tts}

    def _multimodal(self, ids: list[int], p: dict[str, Any]) -> Any:
        """SGLang's ``MultimodalInputs`` for the encoders' outputs in ``p`` (None for a text
        prompt): one precomputed item per contiguous run of placeholders, the deepstack
        features of images and video frames appended to their embeddings (as SGLang's vision
        path lays them out), and the prompt's 3-D rope positions."""
        from sglang.srt.layers.rotary_embedding.mrope import MRotaryEmbedding
        from sglang.srt.managers.schedule_batch import (
            Modality,
            MultimodalDataItem,
            MultimodalInputs,
        )

        torch = self.torch
        tc = self.tc
        t = torch.tensor(ids, dtype=torch.long)
        items: list[Any] = []
        kinds = (
            (Modality.AUDIO, tc.audio_token_id, "audio"),
            (Modality.IMAGE, tc.image_token_id, "image"),
            (Modality.VIDEO, tc.video_token_id, "video"),
        )
        for modality, token, what in kinds:
            where = (t == token).nonzero()[:, 0].tolist()
            values = p.get(f"{what}_embeds")
            if values is None:
                if where:
                    raise ValueError(f"the prompt has {what} placeholders but no {what} input")
                continue
            values = on_device(values, "cpu", torch.float32)
            if len(where) != values.shape[0]:
                raise ValueError(
                    f"{len(where)} {what} placeholders for {values.shape[0]} embeddings"
                )
            deep = p.get(f"{what}_deepstack")
            if deep is not None:  # (layers, n, hidden) -> (n, hidden * (1 + layers))
                deep = on_device(deep, "cpu", torch.float32)
                values = torch.cat([values, *deep], dim=-1)
            at = 0
            for start, end in _runs(where):
                item = MultimodalDataItem(
                    modality=modality,
                    offsets=[(start, end)],
                    precomputed_embeddings=values[at : at + end - start + 1],
                )
                item.set_pad_value()
                items.append(item)
                at += end - start + 1
        if not items:
            return None
        grid = {k: p.get(k) for k in ("image_grid", "video_grid")}
        lens = p.get("audio_lens") or None
        positions, delta = MRotaryEmbedding.get_rope_index_qwen3_omni(
            spatial_merge_size=tc.vision_config.spatial_merge_size,
            image_token_id=tc.image_token_id,
            video_token_id=tc.video_token_id,
            vision_start_token_id=tc.vision_start_token_id,
            tokens_per_second=getattr(tc.vision_config, "tokens_per_second", None),
            input_ids=t[None],
            image_grid_thw=_tensor(torch, grid["image_grid"]),
            video_grid_thw=_tensor(torch, grid["video_grid"]),
            second_per_grid_ts=torch.tensor(p["video_seconds"])
            if grid["video_grid"] is not None
            else None,
            audio_token_id=tc.audio_token_id,
            audio_start_token_id=tc.audio_start_token_id,
            position_id_per_seconds=tc.position_id_per_seconds,
            audio_seqlens=torch.tensor(lens) if lens else None,
            use_audio_in_video=False,
        )
        return MultimodalInputs(
            mm_items=items,
            im_token_id=tc.image_token_id,
            video_token_id=tc.video_token_id,
            audio_token_id=tc.audio_token_id,
            mrope_positions=positions.squeeze(1),
            mrope_position_delta=delta.reshape(-1, 1),
        )


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """Contiguous runs of sorted positions as inclusive (start, end) pairs."""
    runs: list[tuple[int, int]] = []
    for i in positions:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _tensor(torch: Any, value: Any) -> Any:
    return None if value is None else torch.as_tensor(value)


def _with_bias(s: Sampling, extra: tuple[tuple[int, float], ...]) -> Sampling:
    from dataclasses import replace

    return replace(s, logit_bias=s.logit_bias + extra)
