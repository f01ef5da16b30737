"""Qwen3-ASR's ``asr`` stage on SGLang (``engine.backend: sglang``): the clips, their order and
what goes out stay ``stages.ASRExecutor``'s; each clip is a request of SGLang's scheduler
(``worker.engines.sglang``) running SGLang's own Qwen3-ASR (``models/qwen3_asr.py``: the audio
encoder and the Qwen3 decoder), its audio entering as the clip's Whisper features (one
multimodal item keyed by a hash of them). The checkpoint's rope gives every section the same
position, so the prompt's positions are plain ones.
"""

from __future__ import annotations

import json
from typing import Any

from worker.engines.base import Engine, EngineRequest
from worker.models.qwen3_asr.stages import ASRExecutor, _Clip


class SGLangASRExecutor(ASRExecutor):
    def load(self) -> None:
        import torch

        from worker.engines.sglang.engine import EngineSettings, SGLangEngine

        self.torch = torch
        ctx = self.ctx
        self._setup(json.loads((ctx.checkpoint / "config.json").read_text()))
        self.engine: Engine = SGLangEngine(EngineSettings.of_stage(ctx))
        self.live: dict[str, _Clip] = {}  # engine request id -> clip

    def abort(self, rid: str) -> None:
        super().abort(rid)
        for key in [k for k, c in self.live.items() if c.rid == rid]:
            del self.live[key]
            self.engine.abort(key)

    def next_deadline(self) -> float | None:
        return 0.0 if self.queue_depth() or self.engine.has_work() else None

    def _decode(self) -> None:
        """Hand waiting clips to SGLang (it queues what does not fit), run one scheduler
        iteration, and keep each clip's new tokens."""
        for c in self.waiting:
            key = f"{c.rid}/{c.index}"
            self.live[key] = c
            self.engine.submit(
                EngineRequest(
                    key,
                    list(c.ids),
                    self.max_new,
                    sampling=c.sampler.sampling,
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
        from sglang.srt.managers.schedule_batch import (
            Modality,
            MultimodalDataItem,
            MultimodalInputs,
        )

        torch = self.torch
        where = [i for i, t in enumerate(c.ids) if t == self.audio_id]
        item = MultimodalDataItem(
            modality=Modality.AUDIO,
            offsets=[(where[0], where[-1])],
            feature=torch.as_tensor(c.features, dtype=torch.float32)[None],
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
