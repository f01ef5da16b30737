"""Qwen3-Omni's talker: codec frames of all code groups, streamed while the thinker runs.

Its prompt is built as the real model builds it: every user turn from the thinker (text
positions through ``text_projection`` of the thinker's embeddings, audio and image positions
through ``hidden_projection`` of its hidden states at ``accept_hidden_layer``), then the
assistant turn's first tokens with the codec control codes and the speaker. Each step then
feeds the sum of the previous frame's code embeddings plus the projection of the thinker's
next text token (``tts_eos`` after the last one, ``tts_pad`` from then on), so a step needs
only the next two of the thinker's tokens, not the whole reply: audio starts while the thinker
is still writing. The talker predicts a frame's first code; its code predictor the others.
Each is picked as ``generate`` picks it: the control codes suppressed, then the request's
talker sampling (``worker.stages.talker_sampling``): by default the checkpoint's ``talker_*``
generation settings (``generate``'s own defaults: sampled at temperature 0.9, top-k 50,
repetition penalty 1.05 on the first codes) and, for the code predictor, its config's
``do_sample`` (greedy on the released checkpoints).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from worker.models.qwen3_omni.common import load, on_device
from worker.stages.base import (
    CHUNK,
    DONE,
    END,
    INVALID,
    Output,
    RequestMeta,
    StageExecutor,
    check_prompt,
)
from worker.stages.generation_config import read_generation_config
from worker.stages.kvbatch import KVBatch
from worker.stages.sampling import SamplerState
from worker.stages.talker_sampling import (
    TalkerSampling,
    pick_codes,
    predictor_choice,
    sampled,
)

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
    prompt: dict[str, Any]  # preprocessing's payload: ids, audio lengths, image grid
    speaker: int
    max_new: int
    first_picks: SamplerState  # how its first codes are picked
    rest_picks: SamplerState  # how the code predictor's are
    first: dict[str, Any] | None = None  # the thinker's prompt states
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
    # on SGLang (talker_sglang): the prompt the model reads, and each step's inputs and output
    prompt_embeds: Any = None  # (1, positions, H)
    positions: Any = None  # its 3-D rope positions (3, positions)
    trailing: Any = None  # the text the coming step reads (H,)
    frame: Any = None  # the codes of the frame the last step fed in (1, groups)


class TalkerExecutor(StageExecutor):
    def load(self) -> None:
        import torch

        self.torch = torch
        self.config, self.talker = self._load_talker()
        tc = self.config.talker_config
        self.tc = tc
        self.codec_embed = self.talker.get_input_embeddings()
        self.eos = tc.codec_eos_token_id
        self.suppress = suppressed_codes(torch, tc, self.ctx.device)
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
        self.batch = KVBatch()
        self.deltas: Any = None

    def _load_talker(self) -> tuple[Any, Any]:
        """(the model's config, the talker module): transformers' whole talker."""
        return load(self.ctx)

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
        self.start("warmup", meta, {"preprocessing": {"input_ids": ids, "audio_lens": []}})
        zeros = np.zeros((len(ids), th), np.float32)
        first = {"prompt_embed": zeros, "prompt_hidden": zeros, "tts_embeds": zeros[:3]}
        self.feed("warmup", "thinker", {"tokens": [1, 2], "embeds": zeros[:2], **first})
        self.end_stream("warmup", "thinker", {"finish_reason": "stop"})
        self.pending[0].max_new = 3
        while self.pending or self.running:
            self.step()

    # ---- interface -------------------------------------------------------------------------
    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        prompt = inputs["preprocessing"]
        voice = (meta.voice or prompt.get("voice") or DEFAULT_SPEAKER).lower()
        speakers = {k.lower(): v for k, v in (self.tc.speaker_id or {}).items()}
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
        if "prompt_embed" in data:
            r.first = data
        r.tokens.extend(data["tokens"])
        if data.get("embeds") is not None:
            r.embeds.extend(self.torch.as_tensor(data["embeds"]))

    def end_stream(self, rid: str, src: str, info: dict[str, Any]) -> None:
        r = self._find(rid)
        if r is not None:
            r.ended = True
            r.finish = info.get("finish_reason", "stop") if r.speaker >= 0 else r.finish

    def abort(self, rid: str) -> None:
        self.pending = [r for r in self.pending if r.rid != rid]
        if self.running.pop(rid, None) is not None:
            self.batch.leave({rid})

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
        return self._fits(r, len(r.prompt["input_ids"]) + 9)

    def _fits(self, r: _Request, positions: int) -> bool:
        return not self.running or self.batch.fits(positions, self.ctx.kv_tokens)

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
        ids = torch.tensor(r.prompt["input_ids"], device=dev)
        n = ids.shape[0]
        embed = on_device(first["prompt_embed"], dev, dtype)
        hidden = on_device(first["prompt_hidden"], dev, dtype)
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
        tts = self.talker.text_projection(on_device(first["tts_embeds"], dev, dtype))
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
        lens = r.prompt.get("audio_lens") or None
        grid, video = r.prompt.get("image_grid"), r.prompt.get("video_grid")
        total = inputs.shape[1]
        # its prompt plus every frame it may add must fit its own context (the user turn's
        # positions are the thinker's, and the thinker's context may be the longer one)
        context = self.ctx.stage.engine.context_length
        if total >= context:
            raise ValueError(
                f"the talker's prompt of {total} positions exceeds the context length {context}"
            )
        r.max_new = min(r.max_new, context - total)
        if lens or grid is not None or video is not None:
            positions, deltas = self.talker.get_rope_index(
                talker_ids,
                image_grid_thw=torch.from_numpy(grid).to(dev) if grid is not None else None,
                video_grid_thw=torch.from_numpy(video).to(dev) if video is not None else None,
                attention_mask=torch.ones_like(talker_ids),
                audio_seqlens=torch.tensor(lens, device=dev) if lens else None,
                second_per_grids=torch.tensor(r.prompt["video_seconds"], device=dev)
                if video is not None
                else None,
            )
            r.delta = int(deltas.view(-1)[0])
            return inputs, positions[:, 0]
        return inputs, torch.arange(total, device=dev).view(1, -1).expand(3, -1)

    def _prefill(self, r: _Request) -> list[Output]:
        """Start ``r``: its prompt through the talker, its first code picked."""
        torch = self.torch
        inputs, positions = self._prompt(r)
        total = inputs.shape[1]
        text_pos = torch.arange(total, device=self.ctx.device).view(1, 1, -1)
        out = self.talker.model(
            inputs_embeds=inputs,
            position_ids=torch.cat([text_pos, positions[:, None]]),
            use_cache=True,
        )
        r.pos = total
        r.past_hidden = out.last_hidden_state[:, -1:]
        code = self._pick(self.talker.codec_head(out.last_hidden_state[:, -1]), [r])[0]
        r.codes.append(code)
        if code == self.eos or r.max_new <= 1:
            return self._finish(r)
        self.running[r.rid] = r
        self.batch.join(r.rid, out.cache, total)
        return []

    def _prefilled(self) -> list[Output]:
        """What the prefills of this step gave beyond ``_prefill``'s (on this engine, each
        ran there)."""
        return []

    # ---- one frame for every ready request -------------------------------------------------
    def _step(self, rows: list[_Request]) -> list[Output]:
        torch = self.torch
        dev = self.ctx.device
        for r in rows:
            r.trailing = self._trailing(r, len(r.codes) - 1)
        embeds = frame_inputs(self.talker, self.codec_embed, rows)[:, None]
        outs: list[Output] = []
        for r in rows:
            outs.append((CHUNK, r.rid, {"codes": r.frame}))
            r.frames += 1
        # rows not ready this step sit out as masked bubbles
        index = {r.rid: i for i, r in enumerate(rows)}
        full = [self.running[rid] for rid in self.batch.rids]
        step_embeds = torch.cat(
            [
                embeds[index[r.rid] : index[r.rid] + 1] if r.rid in index else embeds[:1] * 0
                for r in full
            ]
        )
        valid = torch.tensor([r.rid in index for r in full], device=dev)
        self.deltas = torch.tensor([r.delta for r in full], device=dev)
        positions = torch.tensor([r.pos for r in full], device=dev)
        logits, hidden = self.batch.step(self._forward, step_embeds, valid, positions, True)
        # (only the ready rows draw: a bubble's draw would tie its codes to the schedule)
        ready = [i for i, r in enumerate(full) if r.rid in index]
        codes = dict(zip(ready, self._pick(logits[ready], [full[i] for i in ready]), strict=True))
        done: set[str] = set()
        for i, r in enumerate(full):
            if r.rid not in index:
                continue
            r.pos += 1
            r.past_hidden = hidden[i : i + 1][:, None]
            r.codes.append(codes[i])
            if codes[i] == self.eos or len(r.codes) >= r.max_new:
                outs += self._finish(r)
                done.add(r.rid)
        if done:
            self.batch.leave(done)
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

    def _forward(
        self, inputs_embeds: Any, attention_mask: Any, position_ids: Any, cache: Any, **_: Any
    ) -> Any:
        rope = (position_ids + self.deltas[:, None])[None].expand(3, -1, -1)
        out = self.talker.model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=self.torch.cat([position_ids[None], rope]),
            cache=cache,
            use_cache=True,
        )
        h = out.last_hidden_state
        return SimpleNamespace(
            logits=self.talker.codec_head(h), hidden_states=(h,), cache=out.cache
        )

    def _pick(self, logits: Any, rows: list[_Request]) -> list[int]:
        return pick_first_codes(logits, self.suppress, rows)

    def _finish(self, r: _Request) -> list[Output]:
        self.running.pop(r.rid, None)
        info = {"frames": r.frames, "text_tokens_read": r.text_read}
        return [(END, r.rid, info), (DONE, r.rid, info)]


# ---- what both engines compute alike (the torch executor above, talker_sglang's model) -------
def suppressed_codes(torch: Any, tc: Any, device: Any) -> Any:
    """The first codes ``generate`` never picks: the control codes (the vocabulary's last
    1,024) but end-of-speech."""
    vocab = tc.text_config.vocab_size
    suppress = torch.zeros(vocab, dtype=torch.bool, device=device)
    suppress[max(0, vocab - 1024) :] = True
    suppress[tc.codec_eos_token_id] = False
    return suppress


def pick_first_codes(logits: Any, suppress: Any, rows: list[_Request]) -> list[int]:
    """Each row's next first code: the control codes suppressed, then its sampler (the
    repetition penalty over its first codes so far, and its draw)."""
    import torch

    logits = logits.float().masked_fill(suppress, float("-inf"))
    return pick_codes(torch, logits, [r.first_picks for r in rows])


def frame_inputs(talker: Any, codec_embed: Any, rows: list[_Request]) -> Any:
    """The next step's input of each row (rows x H): the code predictor completes the frame
    whose first code the row picked last (``r.frame``, all its codes), and the frame's code
    embeddings plus the text the row reads at that step (``r.trailing``) are summed."""
    import torch

    dev = codec_embed.weight.device
    last = torch.tensor([[r.codes[-1]] for r in rows], device=dev)
    past = torch.cat([r.past_hidden for r in rows])
    residual = residual_codes(talker, codec_embed, past, last, rows)  # (B, groups - 1)
    predictor = talker.code_predictor
    frame_sum = codec_embed(last)[:, 0]
    for j in range(residual.shape[1]):
        frame_sum = frame_sum + predictor.model.codec_embedding[j](residual[:, j])
    for i, r in enumerate(rows):
        r.frame = np.array([[r.codes[-1], *residual[i].tolist()]], dtype=np.int64)
    return frame_sum + torch.stack([r.trailing for r in rows])


def residual_codes(
    talker: Any, codec_embed: Any, past: Any, first: Any, rows: list[_Request]
) -> Any:
    """The code predictor: codes 1..groups-1 of the frame whose first code is ``first``,
    from the talker's hidden state that predicted it, each picked by the rows' samplers."""
    import torch

    predictor = talker.code_predictor
    model = predictor.model
    picked = predictor_choice(torch, [r.rest_picks for r in rows])

    def choose(logits: Any) -> Any:
        return logits.argmax(-1) if picked is None else picked(logits)

    out = model(inputs_embeds=torch.cat([past, codec_embed(first)], dim=1), use_cache=True)
    codes = [choose(predictor.lm_head[0](out.last_hidden_state[:, -1]))]
    for j in range(1, talker.config.num_code_groups - 1):
        e = model.codec_embedding[j - 1](codes[-1])[:, None]
        out = model(inputs_embeds=e, cache=out.cache, use_cache=True)
        codes.append(choose(predictor.lm_head[j](out.last_hidden_state[:, -1])))
    return torch.stack(codes, dim=1)
