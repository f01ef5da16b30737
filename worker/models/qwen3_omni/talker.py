"""Qwen3-Omni's talker: codec frames of all code groups, streamed while the thinker runs, on
SGLang's scheduler (the model class ``talker_sglang.Qwen3OmniTalkerForSGLang``).

Its prompt is built as the real model builds it: every user turn from the thinker (text
positions through ``text_projection`` of the thinker's embeddings, audio and image positions
through ``hidden_projection`` of its hidden states at ``accept_hidden_layer``), then the
assistant turn's first tokens with the codec control codes and the speaker. Each step then
feeds the sum of the previous frame's code embeddings plus the projection of the thinker's
next text token (``tts_eos`` after the last one, ``tts_pad`` from then on), so a step needs
only the next two of the thinker's tokens, not the whole reply: audio starts while the thinker
is still writing. The talker predicts a frame's first code; its code predictor the others,
inside the talker's step (in the model class). Each is picked as ``generate`` picks it: the
control codes suppressed, then the request's talker sampling (``worker.layers.talker_sampling``):
by default the checkpoint's ``talker_*`` generation settings (``generate``'s own defaults:
sampled at temperature 0.9, top-k 50, repetition penalty 1.05 on the first codes) and, for the
code predictor, its config's ``do_sample`` (greedy on the released checkpoints).

A step submits the requests it admits and runs SGLang until they are prefilled (every other
request held), then one decode step of the ready requests (the others held: a request whose
next thinker token has not come sits out, keeping its KV).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from worker.contract.sampling import SamplerState, Sampling
from worker.engines.base import EngineRequest
from worker.layers.generation_config import read_generation_config
from worker.layers.stage_weights import LoadReport
from worker.layers.talker_sampling import TalkerSampling, sampled
from worker.models.qwen3_omni.common import on_device
from worker.models.qwen3_omni.payloads import OmniPrompt, TalkerPrompt, ThinkerPiece
from worker.models.qwen3_omni.talker_sglang import register, sglang_model_dir
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
)
from worker.stages.payloads import CodeFrames

DEFAULT_SPEAKER = "ethan"


def checkpoint_sampling(config: Any, generation_config: dict[str, Any]) -> TalkerSampling:
    """How the checkpoint's talker samples: its ``talker_*`` generation settings, else
    ``Qwen3OmniMoeForConditionalGeneration.generate``'s defaults; the code predictor by its
    config's ``do_sample``, then with the top-k 50 and top-p 0.8 its forward passes."""
    g = generation_config
    talker = sampled(
        float(g.get("talker_temperature", 0.9)) if g.get("talker_do_sample", True) else 0.0,
        int(g.get("talker_top_k", 50)),
        float(g.get("talker_top_p", 1.0)),
        float(g.get("talker_repetition_penalty", 1.05)),
    )
    predictor = config.talker_config.code_predictor_config
    sample = bool(getattr(predictor, "do_sample", False))
    subtalker = sampled(float(getattr(predictor, "temperature", 1.0)) if sample else 0.0, 50, 0.8)
    return TalkerSampling(talker, subtalker)


@dataclass(slots=True)
class _Request:
    rid: str
    meta: RequestMeta
    prompt: OmniPrompt  # preprocessing's: ids, audio lengths, image and video grids, voice
    speaker: int
    max_new: int
    first_picks: SamplerState  # how its first codes are picked
    rest_picks: SamplerState  # how the code predictor's are
    first: TalkerPrompt | None = None  # the thinker's prompt states
    tokens: list[int] = field(default_factory=list)
    embeds: list[Any] = field(default_factory=list)  # thinker embeddings of the reply (rows)
    ended: bool = False
    finish: str = "stop"
    started: bool = False
    pos: int = 0
    delta: int = 0
    codes: list[int] = field(default_factory=list)  # first codes so far
    past_hidden: Any = None  # the talker's last hidden state (1, 1, H)
    frames: int = 0
    text_read: int = 0  # positions of the thinker's reply (and its end) the talker has read
    # what the model (talker_sglang) reads: the prompt, and each step's inputs and output
    prompt_embeds: Any = None  # (1, positions, H)
    positions: Any = None  # its 3-D rope positions (3, positions)
    trailing: Any = None  # the text the coming step reads (H,)
    frame: Any = None  # the codes of the frame the last step fed in (1, groups)


class TalkerExecutor(StageExecutor):
    def load(self) -> None:
        import torch

        from worker.engines import sglang as vendor
        from worker.engines.sglang.talkers import held_tensors, talker_engine

        self.torch = torch
        vendor.load()
        register()
        self.engine, self.model_dir = talker_engine(self.ctx, sglang_model_dir)
        self.model: Any = self.engine.model
        self.ctx.extra["loaded"] = LoadReport(*held_tensors(self.model), ())  # (gpu_check)
        self.config, self.talker = self.model.omni_config, self.model.hf
        tc = self.config.talker_config
        self.tc = tc
        self.codec_embed = self.talker.get_input_embeddings()
        self.eos = tc.codec_eos_token_id
        self.pad = int(tc.codec_pad_id)
        self.mm_ids = torch.tensor(
            [tc.audio_token_id, tc.image_token_id, tc.video_token_id], device=self.ctx.device
        )
        # transformers' get_rope_index counts an audio clip's tokens with the audio tower's
        # n_window, read from the model's own config; the talker's has no audio config, so audio
        # together with an image or video failed there (in generate too): lend it the thinker's
        if not hasattr(self.talker.config, "audio_config"):
            self.talker.config.audio_config = self.config.thinker_config.audio_config
        self.sampling = checkpoint_sampling(
            self.config, read_generation_config(self.ctx.component_dir())
        )
        self.pending: list[_Request] = []
        self.running: dict[str, _Request] = {}
        self.model.states = self.running  # what the model reads is what runs
        self.starting: list[_Request] = []  # submitted this step, not prefilled yet

    def warmup(self) -> None:
        meta = RequestMeta("chat", frozenset({"audio"}))
        th = self.tc.thinker_hidden_size
        ids = [
            self.config.im_start_token_id,
            self.config.user_token_id,
            10,
            self.config.im_end_token_id,
        ]
        ids += [self.config.im_start_token_id, self.config.assistant_token_id, 10]
        self.start("warmup", meta, {"input": OmniPrompt(ids)})
        zeros = np.zeros((len(ids), th), np.float32)
        first = TalkerPrompt(zeros, zeros, zeros[:3])
        self.feed("warmup", "thinker", ThinkerPiece([1, 2], embeds=zeros[:2], talker_prompt=first))
        self.end_stream("warmup", "thinker", {"finish_reason": "stop"})
        self.pending[0].max_new = 3
        while self.pending or self.running:
            self.step()

    # ---- interface -------------------------------------------------------------------------
    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        prompt = input_of(inputs, OmniPrompt)
        voice = prompt.voice or DEFAULT_SPEAKER
        speakers = self.tc.speaker_id or {}
        first_picks, rest_picks = self.sampling.with_request(meta.speech_sampling).states(
            self.torch, self.ctx.device
        )
        r = _Request(
            rid,
            meta,
            prompt,
            speaker=speakers.get(voice, -1),
            max_new=self.ctx.stage.engine.max_new_tokens,
            first_picks=first_picks,
            rest_picks=rest_picks,
        )
        if r.speaker < 0:
            r.finish = f"unknown voice {voice!r}; built-in voices: {sorted(speakers)}"
        self.pending.append(r)

    def feed(self, rid: str, src: str, data: Any) -> None:
        r = self._find(rid)
        if r is None:
            return
        piece: ThinkerPiece = data
        if piece.talker_prompt is not None:
            r.first = piece.talker_prompt
        r.tokens.extend(piece.tokens)
        if piece.embeds is not None:
            r.embeds.extend(self.torch.as_tensor(piece.embeds))

    def end_stream(self, rid: str, src: str, info: dict[str, Any]) -> None:
        r = self._find(rid)
        if r is not None:
            r.ended = True
            r.finish = info.get("finish_reason", "stop") if r.speaker >= 0 else r.finish

    def abort(self, rid: str) -> None:
        self.pending = [r for r in self.pending if r.rid != rid]
        if self.running.pop(rid, None) is not None:
            self.engine.abort(rid)

    def next_deadline(self) -> float | None:
        if any(self._can_prefill(r) for r in self.pending):
            return 0.0
        if any(self._ready(r) for r in self.running.values()):
            return 0.0
        return None

    def queue_depth(self) -> int:
        return len(self.pending) + len(self.running)

    def step(self) -> list[Output]:
        outs: list[Output] = []
        with self.torch.inference_mode():
            for r in list(self.pending):
                if not self._can_prefill(r):  # (asked again after each: room is taken)
                    continue
                self.pending.remove(r)
                if r.speaker < 0:
                    outs.append((INVALID, r.rid, f"{self.ctx.name}: {r.finish}"))
                elif not r.tokens:  # the thinker said nothing: nothing to speak
                    outs += self._finish(r)
                else:
                    try:
                        outs += self._prefill(r)
                    except ValueError as exc:
                        outs.append((INVALID, r.rid, f"{self.ctx.name}: {exc}"))
            outs += self._prefilled()
            ready = [r for r in self.running.values() if self._ready(r)]
            if ready:
                outs += self._step(ready)
        return outs

    # ---- scheduling ------------------------------------------------------------------------
    def _find(self, rid: str) -> _Request | None:
        return self.running.get(rid) or next((r for r in self.pending if r.rid == rid), None)

    def _can_prefill(self, r: _Request) -> bool:
        if r.speaker < 0:
            return True
        if len(self.running) >= self.ctx.max_running_requests:
            return False
        if r.first is None or not (r.tokens or r.ended):
            return False
        # within the plan's KV pool, as the thinker admits; the talker's prompt is at most the
        # thinker prompt's user turns and 9 more positions (what ``_prompt`` builds)
        return self._fits(r, len(r.prompt.input_ids) + 9)

    def _fits(self, r: _Request, positions: int) -> bool:
        """Its prompt and every frame it may add beside what the running requests may still
        take: SGLang never has to retract a talker's row (which it would prefill again from
        placeholder ids)."""
        if not self.running:  # (alone: its prompt is checked against the pool when built)
            return True
        taken = sum(x.positions.shape[1] + x.max_new for x in self.running.values())
        return taken + positions + r.max_new <= self.engine.pool_tokens

    def _ready(self, r: _Request) -> bool:
        """Step k needs the thinker's token k + 1 and to know whether it is the last one."""
        k = len(r.codes) - 1
        return r.ended or len(r.tokens) > k + 2

    # ---- prefill ---------------------------------------------------------------------------
    def _prompt(self, r: _Request) -> tuple[Any, Any]:
        """The talker's prompt for ``r`` as embeddings (1, positions, H) and its 3-D rope
        positions (3, positions); sets the request's rope delta and caps its frames by the
        context. ValueError: a prompt the talker cannot take."""
        torch = self.torch
        dev, dtype = self.ctx.device, self.codec_embed.weight.dtype
        first = r.first
        assert first is not None
        ids = torch.tensor(r.prompt.input_ids, device=dev)
        n = ids.shape[0]
        embed = on_device(first.embeds, dev, dtype)
        hidden = on_device(first.hidden, dev, dtype)
        cfg = self.config
        # the role of each position: the token after the last <|im_start|> at or before it
        at = torch.arange(n, device=dev)
        starts = torch.where(ids == cfg.im_start_token_id, at, torch.full_like(at, -1))
        role = ids[(torch.cummax(starts, 0).values.clamp_min(0) + 1).clamp_max(n - 1)]
        user = role == cfg.user_token_id
        mm = torch.isin(ids, self.mm_ids)
        user_part = torch.where(
            mm[:, None], self.talker.hidden_projection(hidden), self.talker.text_projection(embed)
        )[user]
        heads = (
            (ids[:-1] == cfg.im_start_token_id) & (ids[1:] == cfg.assistant_token_id)
        ).nonzero()
        if not len(heads):
            raise ValueError("the prompt has no assistant turn")
        a = int(heads[-1])
        reply = on_device(r.embeds[0], dev, dtype)[None]
        assistant = self.talker.text_projection(torch.cat([embed[a:], reply]))[:4]
        r.text_read = 1  # (the reply's first token is the prompt's last position)
        tts = self.talker.text_projection(on_device(first.tts_embeds, dev, dtype))
        self.tts_bos, self.tts_eos, self.tts_pad = tts[0], tts[1], tts[2]
        text = torch.cat(
            [assistant[:3], self.tts_pad.expand(4, -1), self.tts_bos[None], assistant[3:4]]
        )
        tc = self.tc
        control = torch.tensor(
            [
                tc.codec_nothink_id,
                tc.codec_think_bos_id,
                tc.codec_think_eos_id,
                r.speaker,
                tc.codec_pad_id,
                tc.codec_bos_id,
            ],
            device=dev,
        )
        codec = torch.cat(
            [torch.zeros(3, text.shape[1], device=dev, dtype=dtype), self.codec_embed(control)]
        )
        inputs = torch.cat([user_part, text + codec])[None]
        check_prompt(inputs.shape[1], self.ctx.stage.engine.context_length, self.ctx.kv_tokens)
        talker_ids = torch.cat([ids[user], torch.full((9,), cfg.tts_pad_token_id, device=dev)])[
            None
        ]
        lens = r.prompt.audio_lens or None
        grid, video = r.prompt.image_grid, r.prompt.video_grid
        total = inputs.shape[1]
        # its prompt plus every frame it may add must fit its own context (the user turn's
        # positions are the thinker's, and the thinker's context may be the longer one)
        context = self.ctx.stage.engine.context_length
        if total >= context:
            raise ValueError(
                f"the talker's prompt of {total} positions exceeds the context length {context}"
            )
        r.max_new = min(r.max_new, context - total, self.engine.pool_tokens - total)
        if lens or grid is not None or video is not None:
            positions, deltas = self.talker.get_rope_index(
                talker_ids,
                image_grid_thw=torch.from_numpy(grid).to(dev) if grid is not None else None,
                video_grid_thw=torch.from_numpy(video).to(dev) if video is not None else None,
                attention_mask=torch.ones_like(talker_ids),
                audio_seqlens=torch.tensor(lens, device=dev) if lens else None,
                second_per_grids=torch.tensor(r.prompt.video_seconds, device=dev)
                if video is not None
                else None,
            )
            r.delta = int(deltas.view(-1)[0])
            return inputs, positions[:, 0]
        return inputs, torch.arange(total, device=dev).view(1, -1).expand(3, -1)

    def _prefill(self, r: _Request) -> list[Output]:
        """Submit ``r``: its prompt (the placeholder ids SGLang holds for it, the embeddings
        and rope positions the model reads), its frames to come at most."""
        r.prompt_embeds, positions = self._prompt(r)
        r.positions = positions.long()  # (transformers' rope index may be floats)
        r.pos = r.prompt_embeds.shape[1]
        self.running[r.rid] = r
        self.engine.submit(
            EngineRequest(
                r.rid,
                [self.pad] * r.pos,
                max_new_tokens=r.max_new,
                sampling=Sampling(temperature=0.0),  # (it takes the model's pick)
                stop_token_ids=frozenset({self.eos}),
            )
        )
        self.starting.append(r)
        return []

    def _prefilled(self) -> list[Output]:
        """The engine run until this step's new prompts are prefilled (their first codes
        picked), every running request held."""
        outs: list[Output] = []
        while self.starting:
            if not self.engine.has_work():
                raise RuntimeError("the talker's prompts were not prefilled")
            outs += self._run({r.rid for r in self.starting}, [])
            self.starting = [r for r in self.starting if not r.codes and r.rid in self.running]
        return outs

    # ---- one frame for every ready request -------------------------------------------------
    def _step(self, rows: list[_Request]) -> list[Output]:
        for r in rows:
            r.trailing = self._trailing(r, len(r.codes) - 1)
        return self._run({r.rid for r in rows}, rows)

    def _run(self, stepping: set[str], fed: list[_Request]) -> list[Output]:
        """One engine step of the ``stepping`` requests (the others held): the frames ``fed``
        in (a decode step's rows) come out first, then each pick; a request that picked
        end-of-speech or reached its frames ends."""
        self.engine.held = {rid for rid in self.running if rid not in stepping}
        events = self.engine.step()
        outs: list[Output] = []
        for r in fed:
            if r.frame is None:
                raise RuntimeError(f"talker request {r.rid} was not stepped")
            outs.append((CHUNK, r.rid, CodeFrames(r.frame)))
            r.frame = None
            r.frames += 1
            r.pos += 1
        for ev in events:
            req = self.running.get(ev.rid)
            if req is None:
                continue
            req.codes.extend(ev.tokens)
            if ev.finish == "abort":
                del self.running[req.rid]
                outs.append((INVALID, req.rid, f"{self.ctx.name}: {ev.error}"))
            elif ev.finish is not None:
                outs += self._finish(req)
        return outs

    def _trailing(self, r: _Request, k: int) -> Any:
        """The text the talker reads at step k (each step calls this once): the thinker's
        token k + 1, tts_eos right after the reply's last token (a reply cut by length ends one
        token early, as in the reference), tts_pad after that."""
        if r.ended:
            last = len(r.tokens) if r.finish == "stop" else len(r.tokens) - 1
            if k + 1 > last:
                return self.tts_pad
            if k + 1 == last:
                r.text_read += 1
                return self.tts_eos
        r.text_read += 1
        e = on_device(r.embeds[k + 1], self.ctx.device, self.codec_embed.weight.dtype)
        return self.talker.text_projection(e[None])[0]

    def _finish(self, r: _Request) -> list[Output]:
        self.running.pop(r.rid, None)
        info = {"frames": r.frames, "text_tokens_read": r.text_read}
        return [(END, r.rid, info), (DONE, r.rid, info)]
