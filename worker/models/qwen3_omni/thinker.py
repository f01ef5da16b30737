"""Qwen3-Omni's thinker: the MoE language model on SGLang's scheduler (the project's
``thinker_sglang.Qwen3OmniThinker`` in SGLang's model registry). The prompt
(token ids, the encoders' outputs from the encoder stages) goes to the engine, tokens stream to
decode as they come, a given reply (speech of a known text) streams whole, and with speech
output the talker gets the prompt's token embeddings and its hidden states at the talker's
``accept_hidden_layer`` (captured during the prompt's prefill forwards), then each new token's
embedding.

What SGLang does beyond: the paged KV pool (sized by the plan), the radix prefix cache (a turn
that repeats an earlier prompt's start computes only what is new; ``cached_tokens`` says how
much was reused), chunked prefill mixed with the running decodes, the sampler (every OpenAI
sampling field, seeds included), log probabilities and constrained decoding (xgrammar); the
encoders' outputs enter as its precomputed multimodal embeddings (``sglang_inputs``).

The talker reads a prompt's hidden states at its media positions only (audio, image and video
placeholders in user turns; text positions it reads by their embeddings): a text prompt bound
for the talker reuses cached prefixes like any other; one with media reuses those whose media
runs' states were kept (``media_states``), and is computed again whole when a run's states are
gone.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from worker.contract.sampling import Sampling
from worker.engines.base import EngineEvent, EngineRequest, ForwardTrace
from worker.layers.generation_config import sampling_defaults, stop_tokens
from worker.layers.tensor_cache import TensorCache
from worker.models.qwen3_omni.media_states import MediaRun, media_runs
from worker.models.qwen3_omni.payloads import (
    MediaEmbeddings,
    OmniPrompt,
    TalkerPrompt,
    ThinkerPiece,
)
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
    inputs_of,
    reply_budget,
)


@dataclass(slots=True)
class _Request:
    rid: str
    meta: RequestMeta
    prompt_len: int
    forced: list[int] | None
    to_talker: bool
    ids: list[int] = field(default_factory=list)  # its prompt, for the talker's embeddings
    media: list[MediaRun] = field(default_factory=list)  # a talker-bound prompt's media runs
    submitted: EngineRequest | None = None  # as the engine got it (sent again on a miss)
    generated: int = 0
    started: bool = False  # its first event (the prompt's) went out
    hidden: list[Any] = field(default_factory=list)  # captured prompt pieces, for the talker


class ThinkerExecutor(StageExecutor):
    def load(self) -> None:
        import torch
        from transformers import Qwen3OmniMoeConfig

        from worker.engines import sglang as vendor

        vendor.load()  # before the thinker's model class imports SGLang
        from worker.engines.sglang.engine import EngineSettings, SGLangEngine
        from worker.models.qwen3_omni.thinker_sglang import register

        register()
        self.torch = torch
        ctx = self.ctx
        self.config = Qwen3OmniMoeConfig.from_pretrained(ctx.checkpoint)
        # (every tensor-parallel rank puts the thinker's class in SGLang's registry too)
        settings = EngineSettings.of_stage(ctx, registers=(register,))
        self.engine = SGLangEngine(settings, on_forward=self._on_forward)
        self.capturer = self.engine.model
        self.embed = self.engine.model.thinker.model.embed_tokens
        tc: Any = self.config.thinker_config
        self.tc = tc
        stops = stop_tokens(
            ctx.component_dir(),
            getattr(tc.text_config, "eos_token_id", None),
            (self.config.im_end_token_id,),
        )
        self.eos = frozenset(stops.eos)
        # (Qwen3-Omni's generation config sets its talker's sampling only: greedy text)
        self.defaults = sampling_defaults(ctx.component_dir())
        # (SGLang has no suppressed-token list: the checkpoint's go in as a -inf bias)
        self.suppress = tuple((t, float("-inf")) for t in stops.suppress)
        self.tts_ids = [
            self.config.tts_bos_token_id,
            self.config.tts_eos_token_id,
            self.config.tts_pad_token_id,
        ]
        self.engine_settings = ctx.stage.engine
        self.media_states = TensorCache(ctx.stage.engine.media_state_bytes)
        self.reqs: dict[str, _Request] = {}
        self.engine_rids: dict[str, str] = {}  # engine request id -> stage request id, if other
        self._refused: list[Output] = []  # requests refused at start, reported by the next step

    def warmup(self) -> None:
        meta = RequestMeta("chat", frozenset({"text"}), max_tokens=2)
        self.start("warmup", meta, {"input": OmniPrompt([0, 1, 2])})
        while self.reqs:
            self.step()

    # ---- interface -------------------------------------------------------------------------
    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        prompt = input_of(inputs, OmniPrompt)
        media = MediaEmbeddings.merged(inputs_of(inputs, MediaEmbeddings))
        ids = [int(t) for t in prompt.input_ids]
        r = _Request(
            rid,
            meta,
            prompt_len=len(ids),
            forced=prompt.forced_ids,
            to_talker="talker" in meta.stream_targets,
            ids=ids,
        )
        self.reqs[rid] = r
        eng = self.engine_settings
        try:
            check_prompt(len(ids), eng.context_length, self.ctx.kv_tokens)
            multimodal = self._multimodal(ids, prompt, media)
        except ValueError as exc:
            self.reqs.pop(rid)
            self._refused.append((INVALID, rid, f"{self.ctx.name}: {exc}"))
            return
        namespace = None
        if r.to_talker and multimodal is not None:
            # (a prefix of another such prompt: its media runs' states were kept)
            r.media = media_runs(ids, multimodal)
            namespace = "talker-media" if self.media_states.max_bytes else uuid.uuid4().hex
        r.submitted = EngineRequest(
            rid,
            ids,
            # (a given reply generates nothing: one token, not used)
            max_new_tokens=1
            if r.forced is not None
            else reply_budget(eng, meta.max_tokens, len(ids)),
            sampling=(meta.sampling or Sampling()).under(self.defaults, self.suppress),
            stop_token_ids=self.eos,
            logprobs=meta.logprobs,
            grammar=meta.grammar,
            multimodal=multimodal,
            prefix_namespace=namespace,
        )
        self.engine.submit(r.submitted)

    def abort(self, rid: str) -> None:
        r = self.reqs.get(rid)
        if r is not None:
            self._forget(r)
            if r.submitted is not None:
                self.engine.abort(r.submitted.rid)

    def next_deadline(self) -> float | None:
        return 0.0 if self._refused or self.engine.has_work() else None

    def queue_depth(self) -> int:
        return self.engine.queue_depth()

    def step(self) -> list[Output]:
        outs, self._refused = list(self._refused), []
        self.capturer.capture = any(r.to_talker and not r.started for r in self.reqs.values())
        for ev in self.engine.step():
            r = self._of(ev.rid)
            if r is not None:
                outs += self._on_event(r, ev)
        return outs

    def _forget(self, r: _Request) -> None:
        self.reqs.pop(r.rid, None)
        if r.submitted is not None:
            self.engine_rids.pop(r.submitted.rid, None)

    def _of(self, engine_rid: str) -> _Request | None:
        """The request that the engine runs under ``engine_rid`` now (not one sent again
        under another: the engine may still step the first once while its abort is on the
        way)."""
        r = self.reqs.get(self.engine_rids.get(engine_rid, engine_rid))
        if r is None or r.submitted is None or r.submitted.rid != engine_rid:
            return None
        return r

    # ---- internals ---------------------------------------------------------------------------
    def _on_forward(self, trace: ForwardTrace) -> None:
        """After a prefill forward: each talker-bound request's share of the captured hidden
        states (of the positions computed: those after a cached prefix)."""
        hidden, self.capturer.captured = self.capturer.captured, None
        if hidden is None or not trace.prefill:
            return
        at = 0
        for rid, n in zip(trace.rids, trace.lengths, strict=True):
            r = self._of(rid)
            if r is not None and r.to_talker and not r.started:
                r.hidden.append(hidden[at : at + n])
            at += n

    def _on_event(self, r: _Request, ev: EngineEvent) -> list[Output]:
        if ev.finish == "abort":
            self._forget(r)
            return [(INVALID, r.rid, f"{self.ctx.name}: {ev.error}")]
        talker_prompt: TalkerPrompt | None = None
        if r.to_talker and not r.started:
            talker_prompt = self._prompt_for_talker(r)
            if talker_prompt is None:  # a media run's states are gone: the prompt again, whole
                self._again_whole(r)
                return []
        outs: list[Output] = []
        tokens, logprobs = ev.reply(self.eos)
        first = not r.started
        r.started = True
        if r.forced is not None:  # speech: the reply is given, streamed whole
            pieces: list[list[int]] = [list(r.forced)]
            logprobs = []
            ev.finish = "stop"
        else:  # one piece per token, whatever the batching (docs/reliability.md)
            pieces = [[t] for t in tokens]
        if first and not pieces:
            pieces = [[]]  # the prompt's data goes out even when no token came with it
        for k, tokens_k in enumerate(pieces):
            piece = ThinkerPiece(tokens_k)
            if first and k == 0:
                piece.prompt_tokens, piece.cached_tokens = r.prompt_len, ev.cached_tokens
                piece.talker_prompt = talker_prompt
            if logprobs:
                lp = logprobs[k]
                piece.logprobs = [(lp.logprob, list(lp.top))]
            if r.to_talker:
                ids = self.torch.tensor([tokens_k], dtype=self.torch.long, device=self.ctx.device)
                piece.embeds = self.embed(ids)[0]
            r.generated += len(tokens_k)
            outs.append((CHUNK, r.rid, piece))
        if ev.finish is not None:
            self._forget(r)
            info = {
                "finish_reason": ev.finish,
                "prompt_tokens": r.prompt_len,
                "completion_tokens": r.generated,
                "cached_tokens": ev.cached_tokens,
            }
            outs += [(END, r.rid, info), (DONE, r.rid, info)]
        return outs

    def _prompt_for_talker(self, r: _Request) -> TalkerPrompt | None:
        """The prompt's token embeddings and hidden states, one row per position; None when
        a media run was served from the prefix cache and its states were not kept. The text
        positions that the prefix cache served have no hidden states, which the talker does
        not read there, and get zeros."""
        torch = self.torch
        dev = self.ctx.device
        computed = torch.cat(r.hidden) if r.hidden else None
        r.hidden = []
        n = 0 if computed is None else computed.shape[0]
        cached = r.prompt_len - n
        if cached < 0:
            raise RuntimeError(f"{self.ctx.name}: captured {n} of {r.prompt_len} positions")
        width = self.tc.text_config.hidden_size
        dtype = self.embed.weight.dtype
        hidden = torch.zeros(r.prompt_len, width, dtype=dtype, device=dev)
        if computed is not None:
            hidden[cached:] = computed.to(dtype)
        for start, end, key in r.media:
            if start < cached:  # (some of) the run came from the prefix cache
                kept = self.media_states.get(key)
                if kept is None:
                    return None
                hidden[start : end + 1] = kept.to(dev, dtype)
        for start, end, key in r.media:
            self.media_states.put(key, hidden[start : end + 1])
        ids = torch.tensor(r.ids, device=dev)
        tts = self.embed(torch.tensor(self.tts_ids, device=dev))
        return TalkerPrompt(self.embed(ids), hidden, tts)

    def _multimodal(self, ids: list[int], prompt: OmniPrompt, media: MediaEmbeddings) -> Any:
        """The encoders' outputs as SGLang's ``MultimodalInputs`` (None: a text prompt)."""
        from worker.models.qwen3_omni.sglang_inputs import multimodal_inputs

        return multimodal_inputs(self.tc, ids, prompt, media)

    def _again_whole(self, r: _Request) -> None:
        """Send ``r`` again in a prefix namespace of its own (under another engine id: the
        abort of the first is on its way), so that its whole prompt is computed."""
        first = r.submitted
        assert first is not None
        self.engine.abort(first.rid)
        self.engine_rids.pop(first.rid, None)
        r.submitted = replace(first, rid=f"{r.rid}~whole", prefix_namespace=uuid.uuid4().hex)
        self.engine_rids[r.submitted.rid] = r.rid
        self.engine.submit(r.submitted)
