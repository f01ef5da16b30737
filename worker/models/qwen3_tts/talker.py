"""Qwen3-TTS's talker stage (component: the root model, talker + speaker encoder): it builds each
request's talker prompt (``prompt``), and steps all running requests together on SGLang, one
frame each per step (``talker_sglang``: SGLang's Qwen3 decoder over its paged KV pool, the code
predictor and the first code's pick inside the model's forward), streaming every frame on.

How it samples: the checkpoint's ``generation_config.json`` unless the request says otherwise
(``checkpoint_sampling``). Limits follow the official generate: ``max_new_tokens`` counts
generated first codes, the frame of the last one is never produced, so at most
``max_new_tokens - 1`` frames come out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from worker.contract.sampling import Sampling
from worker.engines.base import EngineRequest
from worker.engines.sglang.talkers import held_tensors, talker_engine
from worker.layers.generation_config import read_generation_config
from worker.layers.stage_weights import LoadReport
from worker.layers.talker_sampling import TalkerSampling, sampled
from worker.models.qwen3_tts import VOICE_DESIGN
from worker.models.qwen3_tts.modeling import Qwen3TTSModel
from worker.models.qwen3_tts.payloads import TalkerInput
from worker.models.qwen3_tts.prompt import PromptBuilder, TTSInputError, speaker_embedding
from worker.models.qwen3_tts.talker_sglang import (
    GREEDY,
    TalkerRequest,
    register,
    sglang_model_dir,
)
from worker.models.qwen3_tts.voice_cache import VoiceCache
from worker.stages.base import (
    CHUNK,
    DONE,
    END,
    FINAL,
    INVALID,
    Output,
    RequestMeta,
    StageExecutor,
    check_prompt,
    input_of,
)
from worker.stages.payloads import CodeFrames, SpokenText, TextPiece


def checkpoint_sampling(generation_config: dict[str, Any]) -> TalkerSampling:
    """How the checkpoint's talkers sample (``generation_config.json``), with the official
    ``generate``'s defaults for what it does not say."""
    g = generation_config

    def settings(sample: str, prefix: str, penalty: float | None) -> Any:
        return sampled(
            float(g.get(f"{prefix}temperature", 0.9)) if g.get(sample, True) else 0.0,
            int(g.get(f"{prefix}top_k", 50)),
            float(g.get(f"{prefix}top_p", 1.0)),
            penalty,
        )

    return TalkerSampling(
        settings("do_sample", "", float(g.get("repetition_penalty", 1.05))),
        settings("subtalker_dosample", "subtalker_", None),
    )


@dataclass
class _Req:
    rid: str
    meta: RequestMeta
    payload: TalkerInput
    talker_req: Any = None  # its TalkerRequest once admitted
    prompt_tokens: int = 0
    kv_need: int = 0  # KV positions it holds once admitted: its prompt and its frame budget
    prompt: Any = None  # its talker prompt, built once (also while it waits for room)
    max_new: int = 0
    frames: int = 0
    started: float = field(default_factory=time.monotonic)
    # streamed text (``text_follows``): what arrived so far, and whether it is complete (its
    # prompt knows which of its tokens the talker has: ``Prompt.text``)
    text: str = ""
    text_done: bool = True


def frame_budget(spec_max_new: int, generation_config: dict[str, Any]) -> int:
    """The most first codes a reply may have: the spec's cap, within the checkpoint's own
    ``max_new_tokens`` (the package's default)."""
    return min(spec_max_new, int(generation_config.get("max_new_tokens") or spec_max_new))


class TalkerExecutor(StageExecutor):
    """The talker stage: SGLang's scheduler and KV pool under the talker's decoder
    (``talker_sglang``), every running request one frame a step. A request is admitted where
    the plan's KV pool has room for its prompt and its whole frame budget; its prompt is
    prefilled with the other new ones (every running request held for that step), then it steps
    with the others, a request reading streamed text sitting out the steps its next word has
    not reached (``SGLangEngine.held``)."""

    def load(self) -> None:
        import torch
        from transformers import AutoTokenizer

        from worker.engines import sglang as vendor

        vendor.load()
        register()
        self.torch = torch
        ck = self.ctx.checkpoint
        self.engine, self.model_dir = talker_engine(self.ctx, sglang_model_dir)
        self.sglang_model: Any = self.engine.model
        self.ctx.extra["loaded"] = LoadReport(*held_tensors(self.sglang_model), ())  # (gpu_check)
        self.eos = self.sglang_model.codes.eos
        self.pad = int(self.sglang_model.config.tts["talker_config"]["codec_pad_id"])
        self.device = self.sglang_model.lm_head.weight.device
        self.prefilling: list[TalkerRequest] = []  # submitted, not prefilled yet
        # the talker's parts beside its decoder: what prompts and x-vectors are built with
        self.model: Qwen3TTSModel = self.sglang_model.tts
        self.builder = PromptBuilder(self.model, AutoTokenizer.from_pretrained(ck))
        defaults = read_generation_config(ck)
        self.sampling = checkpoint_sampling(defaults)
        self.max_new = frame_budget(self.ctx.stage.engine.max_new_tokens, defaults)
        self.max_running = self.ctx.max_running_requests
        self.context = self.ctx.stage.engine.context_length
        # the plan's KV pool (0: none): an admitted request holds its prompt's positions and
        # its whole frame budget, so running requests never run out of room mid-utterance
        self.kv_tokens = self.ctx.kv_tokens
        self.pending: list[_Req] = []
        self.running: dict[str, _Req] = {}
        self.voice_embeddings = VoiceCache()  # speaker embedding per uploaded voice

    def warmup(self) -> None:
        speakers = self.builder.speakers
        payload = TalkerInput("hi", max_new=3)
        if speakers:
            payload.speaker = speakers[0]
        elif self.builder.cfg.get("tts_model_type") == VOICE_DESIGN:
            payload.instruct = "A calm voice."
        else:
            payload.ref_wav = np.sin(np.arange(4800, dtype=np.float32) / 7.0) * 0.1
        self.start("warmup", RequestMeta("speech", frozenset({"audio"})), {"input": payload})
        while self.pending or self.running:
            self.step()

    def close(self) -> None:
        self.engine.close()

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        p = input_of(inputs, TalkerInput)
        self.pending.append(_Req(rid, meta, p, text=p.text, text_done=not p.text_follows))

    def feed(self, rid: str, src: str, data: Any) -> None:
        """More of a streamed text (from the request: ``GenerationRequest.text_stream``)."""
        r = self._find(rid)
        if r is not None:
            piece: TextPiece = data
            r.text += piece.text
            self._give(r)

    def end_stream(self, rid: str, src: str, info: dict[str, Any]) -> None:
        r = self._find(rid)
        if r is not None:
            r.text_done = True
            self._give(r)

    def _find(self, rid: str) -> _Req | None:
        return self.running.get(rid) or next((r for r in self.pending if r.rid == rid), None)

    def _give(self, r: _Req) -> None:
        """A running request's talker gets the streamed text's new complete words: those past
        the ones its prompt holds (a whole text's prompt holds them all, and takes none)."""
        if r.talker_req is None or r.prompt.text_done:
            return
        self.builder.extend(r.prompt, self.builder.text_tokens(r.text, r.text_done), r.text_done)

    def abort(self, rid: str) -> None:
        self.pending = [r for r in self.pending if r.rid != rid]
        r = self.running.pop(rid, None)
        if r is not None:
            self.engine.abort(rid)
            self.sglang_model.states.pop(rid, None)
            self.prefilling = [q for q in self.prefilling if q.rid != rid]

    def next_deadline(self) -> float | None:
        """Now while a request can be admitted, stepped or finished; None while every one
        waits for its streamed text."""
        if len(self.running) < self.max_running and any(map(self._admissible, self.pending)):
            return 0.0
        if any(self._steppable(r) or r.talker_req.done for r in self.running.values()):
            return 0.0
        return None

    def queue_depth(self) -> int:
        return len(self.pending) + len(self.running)

    def _kv_free(self) -> int:
        if not self.kv_tokens:
            return 1 << 62
        return self.kv_tokens - sum(r.kv_need for r in self.running.values())

    def _admissible(self, r: _Req) -> bool:
        """Its text is complete, or has a complete word to start with."""
        return r.text_done or bool(self.builder.text_tokens(r.text, False))

    @staticmethod
    def _steppable(r: _Req) -> bool:
        req = r.talker_req
        return not req.done and req.prompt.ready(req.frames)

    def _admit(self, r: _Req) -> list[Output]:
        """Start ``r`` where the KV pool has room for it (none: it waits, its prompt built)."""
        if r.prompt is None:
            refused = self._build(r)
            if refused:
                return refused
        if r.kv_need > self._kv_free():
            return []  # the caller puts it back: it waits for room
        sampling = self.sampling.with_request(r.meta.speech_sampling)
        r.talker_req = TalkerRequest(r.rid, r.prompt, r.max_new, sampling)
        self._give(r)  # (streamed text that came while it waited)
        self.prefill(r.talker_req)
        self.running[r.rid] = r
        ref_codes = r.payload.ref_codes
        if ref_codes is not None:
            # The reference codes precede the new ones in the decode (as the model decodes a
            # clone: reference + generated, the reference's share of the samples cut off).
            return [(CHUNK, r.rid, CodeFrames(np.asarray(ref_codes, dtype=np.int64), True))]
        return []

    def _build(self, r: _Req) -> list[Output]:
        """``r``'s talker prompt and frame budget; the refusal where it cannot have them."""
        torch = self.torch
        p = r.payload
        try:
            spk_emb = None
            if p.ref_wav is not None:
                wav = torch.from_numpy(np.asarray(p.ref_wav))
                spk_emb = self.voice_embeddings.get(
                    p.voice_key, lambda: speaker_embedding(self.model, wav)
                )
            ref_codes = p.ref_codes
            streamed = p.text_follows
            if streamed and ref_codes is not None:
                raise TTSInputError(
                    "streamed text is read in the model's streaming-text mode, which a voice "
                    "cloned from its transcript does not use: upload it without one"
                )
            prompt = self.builder.build(
                r.text,
                tokens=self.builder.text_tokens(r.text, r.text_done) if streamed else None,
                language=p.language,
                speaker=p.speaker,
                instruct=p.instruct,
                speaker_embedding=spk_emb,
                ref_text=p.ref_text,
                ref_codes=None if ref_codes is None else torch.from_numpy(np.asarray(ref_codes)),
                # as the package's defaults: built-in voices take the text at once
                # (generate_custom_voice), clones one text token per frame (generate_voice_clone);
                # streamed text is read one token per frame as it comes
                non_streaming=p.ref_wav is None and not streamed,
                text_done=r.text_done,
            )
        except TTSInputError as exc:
            return [(INVALID, r.rid, f"{self.ctx.name}: {exc}")]
        r.prompt_tokens = int(prompt.embeds.shape[1])
        try:
            check_prompt(r.prompt_tokens, self.context, self.kv_tokens)
        except ValueError as exc:
            return [(INVALID, r.rid, f"{self.ctx.name}: {exc}")]
        room = min(self.context, self.kv_tokens or self.context)
        max_new = min(p.max_new or self.max_new, self.max_new)
        if r.meta.max_tokens is not None:  # (a realtime response's max_output_tokens, in frames:
            max_new = min(max_new, r.meta.max_tokens + 1)  # the last first code gets none)
        r.max_new = max(1, min(max_new, room - r.prompt_tokens))
        r.kv_need = r.prompt_tokens + r.max_new
        r.prompt = prompt
        return []

    # ---- the talker on SGLang ----------------------------------------------------------------
    def prefill(self, req: TalkerRequest) -> None:
        """Submit ``req`` (SGLang prefills those of a step together, at the next step)."""
        req.first, req.rest = req.sampling.states(self.torch, self.device)
        self.sglang_model.states[req.rid] = req
        n = int(req.prompt.embeds.shape[1])
        self.engine.submit(
            EngineRequest(
                req.rid,
                [self.pad] * n,  # (placeholders: the model reads the prompt's embeddings)
                max_new_tokens=req.max_new_tokens,
                sampling=Sampling(temperature=0.0),  # (it takes the model's pick)
                stop_token_ids=frozenset({self.eos}),
            )
        )
        self.prefilling.append(req)

    def talker_step(self, reqs: list[TalkerRequest]) -> list[tuple[TalkerRequest, Any]]:
        """The new prompts prefilled (every running request held: those steps only prefill),
        then one decode step of ``reqs``, the others held: each one's new frame (groups,)."""
        new = {r.rid for r in self.prefilling}
        states = self.sglang_model.states
        self.engine.held = {rid for rid in states if rid not in new}
        while self.prefilling:
            if not self.engine.has_work():
                raise RuntimeError("the talker's prompts were not prefilled")
            self._finish(self.engine.step())
            self.prefilling = [r for r in self.prefilling if not r.generated and not r.done]
        stepping = {r.rid for r in reqs}
        running = [r for r in reqs if not r.done]
        if not running:
            return []
        self.engine.held = {rid for rid in states if rid not in stepping}
        self._finish(self.engine.step())
        out = []
        for r in running:
            if r.frame is None:
                raise RuntimeError(f"talker request {r.rid} was not stepped")
            out.append((r, r.frame))
            r.frame = None
        return out

    def _finish(self, events: list[Any]) -> None:
        for ev in events:
            r = self.sglang_model.states.get(ev.rid)
            if r is not None and ev.finish is not None:
                r.done = True
                self.sglang_model.states.pop(ev.rid)

    def step(self) -> list[Output]:
        outs: list[Output] = []
        waiting = []
        while self.pending and len(self.running) < self.max_running:
            r = self.pending.pop(0)
            if not self._admissible(r):
                waiting.append(r)
            elif r.kv_need > self._kv_free():
                waiting.append(r)
                break  # first come, first served: it waits for room in the KV pool
            else:
                outs += self._admit(r)
                if r.talker_req is None and r.kv_need:
                    waiting.append(r)  # built, but no room yet
                    break
        self.pending[:0] = waiting
        # (a request reading streamed text sits out a step its next word has not reached)
        live = [r for r in self.running.values() if self._steppable(r)]
        if live:
            for req, f in self.talker_step([r.talker_req for r in live]):
                r = self.running[req.rid]
                r.frames += 1
                outs.append((CHUNK, r.rid, CodeFrames(f.cpu().numpy()[None].astype(np.int64))))
        for r in list(self.running.values()):
            if r.talker_req.done:
                del self.running[r.rid]
                eos = r.talker_req.token == self.eos
                info = {
                    "finish_reason": "stop" if eos else "length",
                    "prompt_tokens": r.prompt_tokens,
                    "completion_tokens": r.frames,
                    "text_tokens_read": r.prompt.text_read(r.talker_req.frames),
                }
                if "words" in r.meta.outputs:  # what the aligner times the audio against
                    outs.append((FINAL, r.rid, SpokenText(r.text)))
                outs += [(END, r.rid, info), (DONE, r.rid, info)]
        return outs


def generate(
    talker: TalkerExecutor,
    texts: list[dict[str, Any]],
    max_new_tokens: int,
    sampling: TalkerSampling = GREEDY,
) -> list[Any]:
    """Whole-utterance generation for several requests at once on a loaded talker (greedy by
    default, as the reference tests compare): each one's codes (frames, groups). ``texts``:
    ``PromptBuilder.build``'s arguments."""
    torch = talker.torch
    reqs = []
    for i, kw in enumerate(texts):
        kw = dict(kw)
        prompt = talker.builder.build(kw.pop("text"), **kw)
        r = TalkerRequest(f"generate-{i}", prompt, max_new_tokens, sampling)
        talker.prefill(r)
        reqs.append(r)
    out: dict[str, list[Any]] = {r.rid: [] for r in reqs}
    while running := [r for r in reqs if not r.done]:
        for r, frame in talker.talker_step(running):
            out[r.rid].append(frame)
    groups = talker.model.config["talker_config"]["num_code_groups"]
    return [
        torch.stack(out[r.rid]) if out[r.rid] else torch.zeros(0, groups, dtype=torch.long)
        for r in reqs
    ]
