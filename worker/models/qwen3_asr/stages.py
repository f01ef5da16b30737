"""Qwen3-ASR's one stage: audio encoder + Qwen3 decoder (component: the whole model).

A transcription request becomes clips cut near pauses (``processor``: at most 1200 s each, 180 s
when timestamps are wanted); every clip is a request of SGLang's scheduler running SGLang's own
Qwen3-ASR (``worker.engines.sglang``), and all running clips of all requests step together (one
engine step per ``step``). When a clip ends,
its text goes out as one delta, preceded by a ``clip`` output (the language the model wrote,
the clip's start and end in seconds: a ``ClipStart`` event), which the transcription API turns
into ``language`` and segments. Greedy unless the request samples (``temperature``), as the official
package decodes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from worker.contract.options import RequestInput, TranscriptionOptions
from worker.contract.sampling import Sampling
from worker.engines.base import EngineRequest
from worker.layers.stage_weights import torch_dtype
from worker.models.qwen3_asr.aligner import SAMPLE_RATE, to_aligner_rate
from worker.models.qwen3_asr.processor import (
    MAX_ALIGN_CLIP_SECONDS,
    MAX_CLIP_SECONDS,
    MIN_CLIP_SECONDS,
    PAUSE_SEARCH_SECONDS,
)
from worker.models.tokens import token_id
from worker.stages.base import (
    DONE,
    FINAL,
    INVALID,
    OUT,
    REQUEST_INPUT,
    Output,
    RequestMeta,
    RequestPreprocessor,
    StageExecutor,
)
from worker.stages.payloads import AlignClips, SpokenAudio, SpokenText

EOS = (151645, 151643)  # what the official generate stops on (<|im_end|>, <|endoftext|>)


@dataclass
class _Clip:
    rid: str
    index: int
    ids: list[int]
    features: Any
    start: float = 0.0
    end: float = 0.0
    samples: Any = None  # the clip's audio, kept for the aligner when timestamps are wanted
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    done: bool = False
    sampling: Sampling = field(default_factory=Sampling)


@dataclass
class _Req:
    rid: str
    language: str | None
    clips: list[_Clip]
    next_out: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    timestamps: bool = False


class ASRExecutor(StageExecutor):
    def load(self) -> None:
        import torch

        from worker.models.qwen3_asr.processor import ASRProcessor

        self.torch = torch
        ctx = self.ctx
        config = json.loads((ctx.checkpoint / "config.json").read_text())
        from worker.engines.sglang.engine import EngineSettings, SGLangEngine

        self.engine = SGLangEngine(EngineSettings.of_stage(ctx))
        self.processor = ASRProcessor(ctx.checkpoint)
        self.eos = set(EOS) | {token_id(self.processor.tokenizer, "<|im_end|>")}
        self.max_new = ctx.stage.engine.max_new_tokens
        self.audio_id = config["thinker_config"]["audio_token_id"]
        self.pending: list[tuple[str, RequestInput, Sampling | None]] = []
        self.requests: dict[str, _Req] = {}
        self.running: list[_Clip] = []
        self.waiting: list[_Clip] = []
        self.live: dict[str, _Clip] = {}  # engine request id -> clip

    def warmup(self) -> None:
        import numpy as np

        wav = np.sin(np.arange(8000, dtype=np.float32) / 5.0) * 0.1
        self.start(
            "warmup",
            RequestMeta("transcription", frozenset({"text"})),
            {REQUEST_INPUT: RequestInput("transcription", audio=wav)},
        )
        limit, self.max_new = self.max_new, 2  # a few steps warm every kernel
        try:
            while self.queue_depth():
                self.step()
        finally:
            self.max_new = limit

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        self.pending.append((rid, inputs[REQUEST_INPUT], meta.sampling))

    def abort(self, rid: str) -> None:
        self.pending = [p for p in self.pending if p[0] != rid]
        self.requests.pop(rid, None)
        self.running = [c for c in self.running if c.rid != rid]
        self.waiting = [c for c in self.waiting if c.rid != rid]
        for key in [k for k, c in self.live.items() if c.rid == rid]:
            del self.live[key]
            self.engine.abort(key)

    def next_deadline(self) -> float | None:
        return 0.0 if self.queue_depth() or self.engine.has_work() else None

    def queue_depth(self) -> int:
        return len(self.pending) + len(self.requests)

    def _accept(
        self, rid: str, req: RequestInput, sampling: Sampling | None = None
    ) -> list[Output]:
        audio = req.audio
        if audio is None or len(audio) == 0:
            return [(INVALID, rid, f"{self.ctx.name}: transcription without audio")]
        opts = req.transcription or TranscriptionOptions()
        try:
            language = self.processor.language(opts.language)
        except ValueError as exc:
            return [(INVALID, rid, f"{self.ctx.name}: {exc}")]
        timestamps = opts.timestamps and bool(self.ctx.stage.next)
        context = opts.prompt or ""
        longest = min(
            MAX_ALIGN_CLIP_SECONDS if timestamps else MAX_CLIP_SECONDS,
            self._seconds_in_context(context, language),
        )
        if longest < MIN_CLIP_SECONDS:
            return [(INVALID, rid, f"{self.ctx.name}: the prompt leaves no room for audio in "
                     f"context_length {self.ctx.stage.engine.context_length}")]  # fmt: skip
        clips = self.processor.clips(audio, language, context, longest)
        kept = [c.samples if timestamps else None for c in clips]
        r = _Req(
            rid,
            language,
            [
                _Clip(
                    rid,
                    i,
                    c.ids,
                    c.features,
                    c.start,
                    c.end,
                    kept[i],
                    sampling=sampling or Sampling(),
                )
                for i, c in enumerate(clips)
            ],
            timestamps=timestamps,
        )
        r.prompt_tokens = sum(len(c.ids) for c in r.clips)
        self.requests[rid] = r
        self.waiting.extend(r.clips)
        return []

    def _seconds_in_context(self, context: str, language: str | None) -> float:
        """The longest clip limit whose prompt and answer fit ``context_length`` (13 audio
        tokens a second; a cut may land 5 s past the limit): the package's limits when the
        context is long enough (16,384 holds 1200 s), shorter clips otherwise, so that no clip
        outgrows the KV cache the plan sized."""
        prompt = self.processor.tokenizer(
            self.processor.prompt(context, language), add_special_tokens=False
        )["input_ids"]
        room = self.ctx.stage.engine.context_length - len(prompt) - self.max_new
        return room // 13 - 1 - PAUSE_SEARCH_SECONDS

    def step(self) -> list[Output]:
        outs: list[Output] = []
        while self.pending:
            outs += self._accept(*self.pending.pop(0))
        self._decode()
        return outs + self._finished_clips()

    def _decode(self) -> None:
        """Hand waiting clips to the engine (it queues what does not fit), run one engine
        step, and keep each clip's new tokens."""
        for c in self.waiting:
            key = f"{c.rid}/{c.index}"
            self.live[key] = c
            self.engine.submit(
                EngineRequest(
                    key,
                    list(c.ids),
                    self.max_new,
                    sampling=c.sampling,
                    stop_token_ids=frozenset(self.eos),
                    multimodal=self._audio(c),
                )
            )
            self.running.append(c)
        self.waiting = []
        for ev in self.engine.step():
            clip = self.live.get(ev.rid)
            if clip is None:
                continue
            clip.tokens += ev.tokens
            if ev.finish is not None:
                del self.live[ev.rid]
                clip.done = True

    def _audio(self, c: _Clip) -> Any:
        """The clip's audio as SGLang's multimodal item: its Whisper features (keyed by a hash
        of them; the checkpoint's rope gives every section the same position, so the prompt's
        positions are plain ones)."""
        torch = self.torch
        features = torch.as_tensor(c.features, dtype=torch.float32)
        from sglang.srt.managers.schedule_batch import (
            Modality,
            MultimodalDataItem,
            MultimodalInputs,
        )

        where = [i for i, t in enumerate(c.ids) if t == self.audio_id]
        item = MultimodalDataItem(
            modality=Modality.AUDIO, offsets=[(where[0], where[-1])], feature=features[None]
        )
        frames = item.feature.shape[-1]
        item.set("feature_attention_mask", torch.ones(1, frames, dtype=torch.long))
        item.set_pad_value()
        n = len(c.ids)
        return MultimodalInputs(
            mm_items=[item],
            audio_token_id=self.audio_id,
            mrope_positions=torch.arange(n)[None].expand(3, n).clone(),
            mrope_position_delta=torch.zeros(1, 1, dtype=torch.long),
        )

    def _finished_clips(self) -> list[Output]:
        """Each request's clips in order as they finish: its ``clip`` output, its text; then the
        request's end (and, with timestamps, its clips for the aligner)."""
        outs: list[Output] = []
        for c in [c for c in self.running if c.done]:
            self.running.remove(c)
        for rid, r in list(self.requests.items()):
            while r.next_out < len(r.clips) and r.clips[r.next_out].done:
                c = r.clips[r.next_out]
                toks = [t for t in c.tokens if t not in self.eos]
                r.completion_tokens += len(c.tokens)
                lang, text = self.processor.parse(self.processor.decode(toks), r.language)
                c.text = text
                outs.append((OUT, rid, ("clip", (lang, c.start, c.end))))
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
                if self.ctx.stage.next:  # the aligner: the clips to time (none unless asked)
                    align = [(c.samples, c.text, c.start) for c in r.clips if c.text.strip()]
                    outs.append((FINAL, rid, AlignClips(align if r.timestamps else [])))
                outs.append((DONE, rid, info))
        return outs


class AlignerExecutor(RequestPreprocessor[AlignClips]):
    """Qwen3-ForcedAligner (component: the checkpoint's ``forced_aligner/``): word times, sent
    as one ``words`` output ([word, start, end] in seconds), for the clips an asr stage hands
    over, or for speech: a talker's whole text with the audio its vocoder made (a Qwen3-TTS
    spec with an aligner stage; the stage is this family's, as its component's config says).
    A request with no clips (no timestamps asked) passes straight on. One request per step in
    arrival order, as preprocessing queues them."""

    def load(self) -> None:
        import torch

        from worker.layers.module_weights import load_stage_weights
        from worker.models.qwen3_asr.aligner import ALIGNER_DIR, ForcedAligner
        from worker.models.qwen3_asr.modeling import Qwen3ASRModel

        comp = self.ctx.stage.component
        ck = self.ctx.checkpoint / (comp.config_dir if comp and comp.config_dir else ALIGNER_DIR)
        with torch.device("meta"):
            model = Qwen3ASRModel(json.loads((ck / "config.json").read_text()))
        dtype = torch_dtype(self.ctx.dtype)
        load_stage_weights(model, self.ctx, ck, dtype=dtype, component=comp)
        self.aligner = ForcedAligner(model.eval(), ck)

    def warmup(self) -> None:
        import numpy as np

        wav = (np.sin(np.arange(16_000, dtype=np.float32) / 5.0) * 0.1).astype(np.float32)
        self.aligner.align([(wav, "warm up", 0.0)], self.ctx.device)

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        self.pending.append((rid, meta, _to_align(list(inputs.values()))))

    def prepare(self, request: AlignClips) -> dict[str, Any]:
        clips = [(w, t, float(o)) for w, t, o in request.clips]
        words = self.aligner.align(clips, self.ctx.device)
        last = float("inf")
        if request.within_audio:
            last = round(max(o + len(w) / SAMPLE_RATE for w, _, o in clips), 3)
        return {"words": [[w.word, min(w.start, last), min(w.end, last)] for w in words]}

    def step(self) -> list[Output]:
        rid, _meta, request = self.pending.pop(0)
        outs: list[Output] = []
        if request.clips:
            stamps = self.prepare(request)["words"]
            outs.append((OUT, rid, ("words", stamps)))
        return [*outs, (DONE, rid, {})]


def _to_align(payloads: list[Any]) -> AlignClips:
    """An aligner's input: an asr stage's clips, or speech's whole text and audio (one clip
    from its start; none where either is empty)."""
    text: SpokenText | None = None
    audio: SpokenAudio | None = None
    for p in payloads:
        if isinstance(p, AlignClips):
            return p
        if isinstance(p, SpokenText):
            text = p
        elif isinstance(p, SpokenAudio):
            audio = p
    if text is None or audio is None:
        raise RuntimeError(f"an aligner takes clips, or a text and its audio; got {payloads!r}")
    if not text.text.strip() or not len(audio.pcm):
        return AlignClips([])
    clip = (to_aligner_rate(audio.pcm, audio.rate), text.text, 0.0)
    return AlignClips([clip], within_audio=True)
