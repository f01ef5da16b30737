"""Qwen3-Omni's code2wav: streamed codec frames (all code groups) -> 24 kHz int16 chunks.

The stream is decoded as its frames come (``worker.layers.streamed_vocoder``: each layer
keeps its state between steps), in ``Qwen3OmniMoeCode2Wav.chunked_decode``'s blocks
(``block_frames``, each with ``left_context_frames`` before it): the streamed waveform is
transformers' decode of the same codes, at any length, each frame decoded once. Steps never
depend on timing, so the bytes are the same under any load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.layers.streamed_vocoder import ConvPart, StreamedDecoder
from worker.models.qwen3_omni.common import load
from worker.stages.vocoder import VocoderExecutor


@dataclass(slots=True)
class _Window:
    cache: Any  # transformers' cache of the pre-transformer (its sliding-window layers)
    position: int = 0


class _Front:
    """``Qwen3OmniMoeCode2Wav.forward`` up to its convolutions, a few frames at a time: the
    code embeddings per frame, then the pre-transformer with transformers' own cache (its
    sliding-window layers keep the keys and values later frames still see)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def fresh(self) -> _Window:
        from transformers import DynamicCache

        return _Window(DynamicCache(config=self.model.pre_transformer.config))

    def __call__(self, codes: Any, state: _Window) -> Any:
        import torch

        m = self.model
        hidden = m.code_embedding(codes + m.code_offset).mean(1)
        n = hidden.shape[1]
        positions = torch.arange(state.position, state.position + n, device=hidden.device)
        hidden = m.pre_transformer(
            inputs_embeds=hidden, cache=state.cache, use_cache=True, position_ids=positions[None]
        ).last_hidden_state
        state.position += n
        return hidden.permute(0, 2, 1)


class Code2WavExecutor(VocoderExecutor):
    def load(self) -> None:
        self.config, self.model = load(self.ctx)
        schedule = self.streaming_schedule(int(self.model.total_upsample))
        convs = ConvPart([*self.model.upsample, *self.model.decoder])
        self.decoder = StreamedDecoder(_Front(self.model), convs, schedule, self.ctx.device)
        self.init_streams()

    def warmup(self) -> None:
        import torch

        groups = self.model.config.num_quantizers
        with torch.inference_mode():
            self.model(torch.zeros(1, groups, 2, dtype=torch.long, device=self.ctx.device))
