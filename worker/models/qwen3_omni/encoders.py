"""Qwen3-Omni's encoders: the audio tower and the vision encoder, batched over requests.

Each request's inputs go in whole (all its clips or images) and its embeddings come out per
request: the audio tower encodes every clip on its own windows, so clips of several requests
share one call; the vision encoder takes each image's patches with its grid.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from worker.models.qwen3_omni.common import load
from worker.stages.base import FINAL, BatchQueue, Output, RequestMeta, StageExecutor


class _Encoder(StageExecutor):
    KEYS: tuple[str, ...] = ()  # the preprocessing payload entries this encoder consumes

    def load(self) -> None:
        import torch

        self.torch = torch
        self.config, self.model = load(self.ctx)
        b = self.ctx.stage.batching
        self.queue = BatchQueue(b.max_batch_size, b.window_ms)
        self.empty: list[str] = []  # requests without this modality: answered at once

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        payload = inputs["preprocessing"]
        if not any(payload.get(k) is not None for k in self.KEYS):
            self.empty.append(rid)
        else:
            self.queue.put(rid, payload, weight=self._weight(payload))

    def _weight(self, payload: dict[str, Any]) -> int:
        return 1

    def abort(self, rid: str) -> None:
        self.queue.drop(rid)
        self.empty = [r for r in self.empty if r != rid]

    def next_deadline(self) -> float | None:
        return 0.0 if self.empty else self.queue.deadline()

    def queue_depth(self) -> int:
        return len(self.queue) + len(self.empty)

    def step(self) -> list[Output]:
        outs: list[Output] = [(FINAL, rid, {}) for rid in self.empty]
        self.empty = []
        deadline = self.queue.deadline()
        if deadline is not None and deadline <= _now():
            batch = self.queue.take()
            with self.torch.inference_mode():
                outs += self._encode(batch)
        return outs

    def _encode(self, batch: list[tuple[str, dict[str, Any]]]) -> list[Output]:
        raise NotImplementedError


class AudioTowerExecutor(_Encoder):
    KEYS = ("audio_features",)

    def warmup(self) -> None:
        mels = self.config.thinker_config.audio_config.num_mel_bins
        self._encode(
            [("warmup", {"audio_features": np.zeros((mels, 200), np.float32), "audio_lens": [200]})]
        )

    def _weight(self, payload: dict[str, Any]) -> int:
        return len(payload["audio_lens"])

    def _encode(self, batch: list[tuple[str, dict[str, Any]]]) -> list[Output]:
        from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
            _get_feat_extract_output_lengths as tokens_of,
        )

        torch = self.torch
        feats = np.concatenate([p["audio_features"] for _, p in batch], axis=1)
        lens = [n for _, p in batch for n in p["audio_lens"]]
        x = torch.from_numpy(feats).to(self.ctx.device, self.model.dtype)
        # stays a tensor on the device: a thinker in this process takes it as it is
        hidden = self.model(
            x, feature_lens=torch.tensor(lens, device=self.ctx.device)
        ).last_hidden_state
        outs: list[Output] = []
        at = 0
        for rid, p in batch:
            n = sum(int(tokens_of(torch.tensor(k), 50)) for k in p["audio_lens"])
            outs.append((FINAL, rid, {"audio_embeds": hidden[at : at + n]}))
            at += n
        return outs


class VisionExecutor(_Encoder):
    """Images and video frames through the same encoder (each with its own grid)."""

    KEYS = ("pixel_values", "video_values")

    def warmup(self) -> None:
        cfg = self.config.thinker_config.vision_config
        dim = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size**2
        merge = cfg.spatial_merge_size
        grid = np.array([[1, 2 * merge, 2 * merge]], dtype=np.int64)
        pixels = np.zeros((int(grid.prod()), dim), np.float32)
        self._encode([("warmup", {"pixel_values": pixels, "image_grid": grid})])

    def _weight(self, payload: dict[str, Any]) -> int:
        return sum(
            len(payload[g]) for g in ("image_grid", "video_grid") if payload.get(g) is not None
        )

    def _encode(self, batch: list[tuple[str, dict[str, Any]]]) -> list[Output]:
        results: dict[str, dict[str, Any]] = {rid: {} for rid, _ in batch}
        for values, grid, kind in (
            ("pixel_values", "image_grid", "image"),
            ("video_values", "video_grid", "video"),
        ):
            items = [(rid, p) for rid, p in batch if p.get(values) is not None]
            if items:
                self._run(items, values, grid, kind, results)
        return [(FINAL, rid, results[rid]) for rid, _ in batch]

    def _run(self, items: list, values: str, grid_key: str, kind: str, results: dict) -> None:
        torch = self.torch
        pixels = np.concatenate([p[values] for _, p in items])
        grid = np.concatenate([p[grid_key] for _, p in items])
        out = self.model(
            torch.from_numpy(pixels).to(self.ctx.device, self.model.dtype),
            grid_thw=torch.from_numpy(grid).to(self.ctx.device),
        )
        merged = out.pooler_output
        deep = torch.stack(list(out.deepstack_features))  # (layers, tokens, hidden)
        merge = self.model.spatial_merge_size**2
        at = 0
        for rid, p in items:
            n = int(sum(int(g.prod()) for g in p[grid_key]) // merge)
            results[rid][f"{kind}_embeds"] = merged[at : at + n]
            results[rid][f"{kind}_deepstack"] = deep[:, at : at + n]
            at += n


def _now() -> float:
    import time

    return time.monotonic()
