"""Qwen3-ASR's one stage: audio encoder + Qwen3 decoder (component: the whole model).

A transcription request becomes clips cut near pauses (``processor``: at most 1200 s each, 180 s
when timestamps are wanted); every clip is a decode of its own, and all running clips of all
requests step together (one batched decoder step per ``step``). When a clip ends, its text goes
out as one delta, preceded by a control delta (``CLIP_MARK`` + JSON: the language the model
wrote, the clip's start and end in seconds), which the transcription API turns into
``language`` and segments. Greedy, as the official package decodes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from worker.models.qwen3_asr.processor import MAX_ALIGN_CLIP_SECONDS, MAX_CLIP_SECONDS
from worker.stages.base import DONE, INVALID, OUT, Output, RequestMeta, StageExecutor

CLIP_MARK = "\x00clip:"  # a text delta starting with this describes the clip whose text follows
OPTIONS_ROLE = "asr_options"
EOS = (151645, 151643)  # what the official generate stops on (<|im_end|>, <|endoftext|>)


@dataclass
class _Clip:
    rid: str
    index: int
    ids: list[int]
    features: Any
    start: float = 0.0
    end: float = 0.0
    cache: Any = None
    hidden: Any = None
    tokens: list[int] = field(default_factory=list)
    done: bool = False


@dataclass
class _Req:
    rid: str
    language: str | None
    clips: list[_Clip]
    next_out: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class ASRExecutor(StageExecutor):
    def load(self) -> None:
        import torch

        from worker.models.qwen3_asr.modeling import Qwen3ASRModel
        from worker.models.qwen3_asr.processor import ASRProcessor
        from worker.models.qwen3_tts.weights import load_stage_weights

        self.torch = torch
        ck = self.ctx.checkpoint
        config = json.loads((ck / "config.json").read_text())
        with torch.device("meta"):
            model = Qwen3ASRModel(config)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
            str(self.ctx.stage.dtype)
        ]
        load_stage_weights(model, self.ctx, ck, dtype=dtype, component=self.ctx.stage.component)
        self.model = model.eval()
        self.processor = ASRProcessor(ck)
        self.eos = set(EOS) | {self.processor.tokenizer.convert_tokens_to_ids("<|im_end|>")}
        self.max_new = self.ctx.stage.engine.max_new_tokens
        self.max_running = self.ctx.max_running_requests
        self.audio_id = config["thinker_config"]["audio_token_id"]
        self.pending: list[tuple[str, dict]] = []
        self.requests: dict[str, _Req] = {}
        self.running: list[_Clip] = []
        self.waiting: list[_Clip] = []

    def warmup(self) -> None:
        import numpy as np

        wav = np.sin(np.arange(8000, dtype=np.float32) / 5.0) * 0.1
        self.start(
            "warmup",
            RequestMeta("transcription", frozenset({"text"})),
            {"request": {"kind": "transcription", "audio": wav}},
        )
        while self.queue_depth():
            self.step()

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        self.pending.append((rid, inputs["request"]))

    def abort(self, rid: str) -> None:
        self.pending = [p for p in self.pending if p[0] != rid]
        self.requests.pop(rid, None)
        self.running = [c for c in self.running if c.rid != rid]
        self.waiting = [c for c in self.waiting if c.rid != rid]

    def next_deadline(self) -> float | None:
        return 0.0 if self.queue_depth() else None

    def queue_depth(self) -> int:
        return len(self.pending) + len(self.requests)

    def _accept(self, rid: str, req: dict) -> list[Output]:
        audio = req.get("audio")
        if audio is None or len(audio) == 0:
            return [(INVALID, rid, f"{self.ctx.name}: transcription without audio")]
        opts = next((m for m in req.get("messages") or [] if m.get("role") == OPTIONS_ROLE), {})
        try:
            language = self.processor.language(opts.get("language"))
        except ValueError as exc:
            return [(INVALID, rid, f"{self.ctx.name}: {exc}")]
        longest = MAX_ALIGN_CLIP_SECONDS if opts.get("timestamps") else MAX_CLIP_SECONDS
        clips = self.processor.clips(audio, language, opts.get("prompt") or "", longest)
        r = _Req(
            rid,
            language,
            [_Clip(rid, i, c.ids, c.features, c.start, c.end) for i, c in enumerate(clips)],
        )
        r.prompt_tokens = sum(len(c.ids) for c in r.clips)
        self.requests[rid] = r
        self.waiting.extend(r.clips)
        return []

    def _prefill(self, c: _Clip) -> None:
        from worker.models.qwen3_tts.modeling import KVCache

        torch = self.torch
        th = self.model.thinker
        ids = torch.tensor([c.ids], device=self.ctx.device)
        x = th.model.embed_tokens(ids)
        audio = th.audio_tower(c.features.to(self.ctx.device, x.dtype))
        mask = ids[0] == self.audio_id
        x[0, mask] = audio.to(x.dtype)
        c.cache = KVCache.empty(th.model.s.num_layers)
        c.hidden = th.model.prefill(x, c.cache)[:, -1:]
        self._pick([c])

    def _pick(self, clips: list[_Clip]) -> None:
        torch = self.torch
        h = torch.cat([c.hidden for c in clips])[:, -1]
        toks = self.model.thinker.logits(h).argmax(-1).tolist()
        for c, t in zip(clips, toks, strict=True):
            c.tokens.append(t)
            if t in self.eos or len(c.tokens) >= self.max_new:
                c.done = True

    def step(self) -> list[Output]:
        torch = self.torch
        outs: list[Output] = []
        while self.pending:
            outs += self._accept(*self.pending.pop(0))
        with torch.inference_mode():
            while self.waiting and len(self.running) < self.max_running:
                c = self.waiting.pop(0)
                self._prefill(c)
                self.running.append(c)
            live = [c for c in self.running if not c.done]
            if live:
                th = self.model.thinker
                x = th.model.embed_tokens(
                    torch.tensor([[c.tokens[-1]] for c in live], device=self.ctx.device)
                )
                h = th.model.step(x, [c.cache for c in live])
                for i, c in enumerate(live):
                    c.hidden = h[i : i + 1]
                self._pick(live)
        for c in [c for c in self.running if c.done]:
            self.running.remove(c)
            c.cache = None
        for rid, r in list(self.requests.items()):
            while r.next_out < len(r.clips) and r.clips[r.next_out].done:
                c = r.clips[r.next_out]
                toks = [t for t in c.tokens if t not in self.eos]
                r.completion_tokens += len(c.tokens)
                lang, text = self.processor.parse(self.processor.decode(toks), r.language)
                mark = {"language": lang, "start": c.start, "end": c.end}
                outs.append((OUT, rid, ("text", CLIP_MARK + json.dumps(mark))))
                outs.append((OUT, rid, ("text", text)))
                r.next_out += 1
            if r.next_out == len(r.clips):
                del self.requests[rid]
                last = r.clips[-1]
                info = {
                    "finish_reason": "stop" if last.tokens and last.tokens[-1] in self.eos
                    else "length",
                    "prompt_tokens": r.prompt_tokens,
                    "completion_tokens": r.completion_tokens,
                }  # fmt: skip
                outs.append((DONE, rid, info))
        return outs
