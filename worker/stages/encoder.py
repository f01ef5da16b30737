"""Audio encoder: log-mel clips -> embeddings for the thinker, and a speaker vector for the talker.

Clips of several requests are batched (max batch size in clips, short window). Encoder frames
are average-pooled (``POOL``) into audio tokens and trimmed to the audio's real length; an
uploaded voice's reference audio becomes one speaker vector (mean of its frames) that conditions
the talker.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from worker.stages.base import FINAL, BatchQueue, Output, RequestMeta, StageExecutor, load_model

POOL = 4  # encoder frames per audio token (Whisper frames are 20 ms -> 12.5 tokens/s)


class EncoderExecutor(StageExecutor):
    def load(self) -> None:
        import torch

        self.torch = torch
        self.model = load_model(self.ctx)
        # samples per encoder output frame: hop length x the convolutions' stride of 2
        self.samples_per_frame = 320
        b = self.ctx.stage.batching
        self.queue = BatchQueue(b.max_batch_size, b.window_ms)

    def warmup(self) -> None:
        n_mels = self.model.config.num_mel_bins
        frames = 2 * self.model.config.max_source_positions
        self._encode(np.zeros((1, n_mels, frames), dtype=np.float32))

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        (payload,) = inputs.values()
        n = sum(len(payload.get(k, ())) for k in ("audio_features", "voice_features"))
        self.queue.put(rid, payload, weight=n)

    def abort(self, rid: str) -> None:
        self.queue.drop(rid)

    def next_deadline(self) -> float | None:
        return self.queue.deadline()

    def queue_depth(self) -> int:
        return len(self.queue)

    def step(self) -> list[Output]:
        batch = self.queue.take()
        clips = [p[k] for _, p in batch for k in ("audio_features", "voice_features") if k in p]
        hidden = self._encode(np.concatenate(clips)) if clips else None
        outs: list[Output] = []
        at = 0
        for rid, payload in batch:
            out = {k: v for k, v in payload.items() if not k.endswith(("_features", "_samples"))}
            if "audio_features" in payload:
                n = len(payload["audio_features"])
                out["audio_embeds"] = self._tokens(hidden[at : at + n], payload["audio_samples"])
                at += n
            if "voice_features" in payload:
                n = len(payload["voice_features"])
                frames = self._frames(hidden[at : at + n], payload["voice_samples"])
                out["speaker_embed"] = frames.mean(axis=0)
                at += n
            outs.append((FINAL, rid, out))
        return outs

    def _encode(self, feats: np.ndarray) -> np.ndarray:
        torch = self.torch
        with torch.inference_mode():
            x = torch.from_numpy(feats).to(self.ctx.device, self.model.dtype)
            return self.model(x).last_hidden_state.float().cpu().numpy()

    def _frames(self, hidden: np.ndarray, samples: int) -> np.ndarray:
        """Concatenate clips' frames and cut the padding after the real audio."""
        frames = hidden.reshape(-1, hidden.shape[-1])
        return frames[: max(1, math.ceil(samples / self.samples_per_frame))]

    def _tokens(self, hidden: np.ndarray, samples: int) -> np.ndarray:
        frames = self._frames(hidden, samples)
        n = math.ceil(len(frames) / POOL)
        padded = np.zeros((n * POOL, frames.shape[1]), dtype=np.float32)
        padded[: len(frames)] = frames
        counts = np.minimum(POOL, len(frames) - np.arange(n) * POOL)[:, None]
        return padded.reshape(n, POOL, -1).sum(axis=1) / counts
