"""Qwen3-TTS's vocoder stage: the speech tokenizer's decoder (``speech_tokenizer`` / ``decoder``)
decoding frames as they come, each layer keeping its state between steps, in the package's
blocks (300 frames, 25 before each), in steps that ramp up (1, 2, 4, ... frames up to
``chunk_frames``: the first audio needs one talker step): the streamed waveform is the
package's decode at any length, at the cost of one decode of each frame
(``worker.layers.streamed_vocoder``)."""

from __future__ import annotations

import json

from worker.layers.stage_weights import torch_dtype
from worker.layers.streamed_vocoder import ConvPart, StreamedDecoder
from worker.stages.vocoder import VocoderExecutor


class TTSVocoderExecutor(VocoderExecutor):
    """The speech tokenizer's decoder, streamed (``worker.layers.streamed_vocoder``) in the
    package's blocks (``SpeechDecoder.chunked``: 300 frames, each with 25 before it)."""

    def load(self) -> None:
        import torch

        from worker.layers.module_weights import load_stage_weights
        from worker.models.qwen3_tts.codec import SpeechDecoder

        comp = self.ctx.stage.component
        st_dir = self.ctx.checkpoint / (comp.config_dir if comp else "speech_tokenizer")
        cfg = json.loads((st_dir / "config.json").read_text())
        with torch.device("meta"):
            dec = SpeechDecoder(cfg["decoder_config"])
        load_stage_weights(
            dec,
            self.ctx,
            st_dir,
            prefix="decoder.",
            device=self.ctx.device,
            dtype=torch_dtype(self.ctx.dtype),
            component=comp,
        )
        self.model = dec.eval()
        front, convs = dec.streamed()
        schedule = self.streaming_schedule(dec.total_upsample)
        self.decoder = StreamedDecoder(front, ConvPart(convs), schedule, self.ctx.device)
        self.init_streams()

    def warmup(self) -> None:
        import torch

        groups = self.model.num_quantizers
        with torch.inference_mode():
            wav = self.model(torch.zeros(1, groups, 2, dtype=torch.long, device=self.ctx.device))
        if wav.shape[-1] != 2 * self.model.total_upsample:  # (no lag: every sample streams)
            raise RuntimeError(f"the decoder gave {wav.shape[-1]} samples for 2 frames")
