"""Qwen3-Omni's encoders: the audio tower and the vision encoder, batched over requests.

Each request's inputs go in whole (all its clips or images) and its embeddings come out per
request: the audio tower encodes every clip on its own windows, so clips of several requests
share one call; the vision encoder takes each image's patches with its grid.

Each clip, image and video is encoded once: its outputs are kept by the digest of its features
or patches (``engine.encoder_cache_bytes``, ``worker.layers.tensor_cache``), so a conversation
that resends its history, a clip in an earlier turn, finds it encoded. A batch encodes only the
items new to the cache, each once however many requests carry it.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from worker.layers.tensor_cache import TensorCache
from worker.models.qwen3_omni.common import load
from worker.models.qwen3_omni.payloads import MediaEmbeddings, OmniPrompt
from worker.stages.base import (
    FINAL,
    BatchQueue,
    Output,
    RequestMeta,
    StageExecutor,
    input_of,
)


class _Encoder(StageExecutor):
    KEYS: tuple[str, ...] = ()  # the prompt's media this encoder consumes (``OmniPrompt``)

    def load(self) -> None:
        import torch

        self.torch = torch
        self.config, self.model = load(self.ctx)
        b = self.ctx.stage.batching
        self.queue = BatchQueue(b.max_batch_size, b.window_ms)
        self.empty: list[str] = []  # requests without this modality: answered at once
        self.cache = TensorCache(self.ctx.stage.engine.encoder_cache_bytes)

    def start(self, rid: str, meta: RequestMeta, inputs: dict[str, Any]) -> None:
        payload = input_of(inputs, OmniPrompt)
        if not any(getattr(payload, k) is not None for k in self.KEYS):
            self.empty.append(rid)
        else:
            self.queue.put(rid, payload, weight=self._weight(payload))

    def _weight(self, payload: OmniPrompt) -> int:
        return 1

    def abort(self, rid: str) -> None:
        self.queue.drop(rid)
        self.empty = [r for r in self.empty if r != rid]

    def next_deadline(self) -> float | None:
        return 0.0 if self.empty else self.queue.deadline()

    def queue_depth(self) -> int:
        return len(self.queue) + len(self.empty)

    def step(self) -> list[Output]:
        outs: list[Output] = [(FINAL, rid, MediaEmbeddings()) for rid in self.empty]
        self.empty = []
        deadline = self.queue.deadline()
        if deadline is not None and deadline <= _now():
            batch = self.queue.take()
            with self.torch.inference_mode():
                outs += self._encode(batch)
        return outs

    def _encode(self, batch: list[tuple[str, OmniPrompt]]) -> list[Output]:
        raise NotImplementedError


class AudioTowerExecutor(_Encoder):
    KEYS = ("audio_features",)

    def warmup(self) -> None:
        mels = self.config.thinker_config.audio_config.num_mel_bins
        features = np.zeros((mels, 200), np.float32)
        self._encode([("warmup", OmniPrompt([], audio_features=features, audio_lens=[200]))])

    def _weight(self, payload: OmniPrompt) -> int:
        return len(payload.audio_lens)

    def _encode(self, batch: list[tuple[str, OmniPrompt]]) -> list[Output]:
        from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
            _get_feat_extract_output_lengths as tokens_of,
        )

        torch = self.torch
        dev = self.ctx.device
        clips: list[list[bytes]] = []  # each request's clips, by digest
        found: dict[bytes, Any] = {}  # digest -> embeddings, on the device
        new: dict[bytes, np.ndarray] = {}  # digest -> features, to encode
        for _, p in batch:
            feats, at, keys = p.audio_features, 0, []
            assert feats is not None  # (queued: it has audio)
            for n in p.audio_lens:
                clip = feats[:, at : at + n]
                at += n
                keys.append(key := _digest("audio", clip))
                if key not in found and key not in new:
                    kept = self.cache.get(key)
                    if kept is None:
                        new[key] = clip
                    else:
                        found[key] = kept.to(dev)
            clips.append(keys)
        if new:
            lens = [c.shape[1] for c in new.values()]
            x = torch.from_numpy(np.concatenate(list(new.values()), axis=1))
            # stays a tensor on the device: a thinker in this process takes it as it is
            hidden = self.model(
                x.to(dev, self.model.dtype), feature_lens=torch.tensor(lens, device=dev)
            ).last_hidden_state
            at = 0
            for key, n in zip(new, lens, strict=True):
                k = int(tokens_of(torch.tensor(n), 50))
                found[key] = hidden[at : at + k]
                self.cache.put(key, found[key])
                at += k
        outs: list[Output] = []
        for (rid, _), keys in zip(batch, clips, strict=True):
            parts = [found[key] for key in keys]
            embeds = parts[0] if len(parts) == 1 else torch.cat(parts)
            outs.append((FINAL, rid, MediaEmbeddings(audio=embeds)))
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
        self._encode([("warmup", OmniPrompt([], pixel_values=pixels, image_grid=grid))])

    def _weight(self, payload: OmniPrompt) -> int:
        grids = (payload.image_grid, payload.video_grid)
        return sum(len(g) for g in grids if g is not None)

    def _encode(self, batch: list[tuple[str, OmniPrompt]]) -> list[Output]:
        results = {rid: MediaEmbeddings() for rid, _ in batch}
        for values, grid, kind in (
            ("pixel_values", "image_grid", "image"),
            ("video_values", "video_grid", "video"),
        ):
            items = [(rid, p) for rid, p in batch if getattr(p, values) is not None]
            if items:
                self._run(items, values, grid, kind, results)
        return [(FINAL, rid, results[rid]) for rid, _ in batch]

    def _run(self, items: list, values: str, grid_key: str, kind: str, results: dict) -> None:
        torch = self.torch
        dev = self.ctx.device
        merge = self.model.spatial_merge_size**2
        keys_of: list[list[bytes]] = []  # each request's images (or videos), by digest
        found: dict[bytes, tuple[Any, Any]] = {}  # digest -> (merged, deepstack), on the device
        new: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}  # digest -> (patches, grid)
        for _, p in items:
            at, keys = 0, []
            for grid in getattr(p, grid_key):
                rows = int(grid.prod())
                patches = getattr(p, values)[at : at + rows]
                at += rows
                keys.append(key := _digest(kind, patches, grid))
                if key not in found and key not in new:
                    kept = self.cache.get(key)
                    if kept is None:
                        new[key] = (patches, grid)
                    else:
                        found[key] = (kept[0].to(dev), kept[1].to(dev))
            keys_of.append(keys)
        if new:
            out = self.model(
                torch.from_numpy(np.concatenate([px for px, _ in new.values()])).to(
                    dev, self.model.dtype
                ),
                grid_thw=torch.from_numpy(np.stack([g for _, g in new.values()])).to(dev),
            )
            merged = out.pooler_output
            deep = torch.stack(list(out.deepstack_features))  # (layers, tokens, hidden)
            at = 0
            for key, (_, grid) in new.items():
                n = int(grid.prod()) // merge
                found[key] = (merged[at : at + n], deep[:, at : at + n])
                self.cache.put(key, found[key])
                at += n
        for (rid, _), keys in zip(items, keys_of, strict=True):
            setattr(results[rid], kind, torch.cat([found[k][0] for k in keys]))
            deepstack = torch.cat([found[k][1] for k in keys], dim=1)
            setattr(results[rid], f"{kind}_deepstack", deepstack)


def _digest(kind: str, values: np.ndarray, grid: np.ndarray | None = None) -> bytes:
    """The key of one clip's features or one image's (video's) patches with its grid."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{kind}:{values.shape}:{values.dtype}:".encode())
    h.update(np.ascontiguousarray(values).data)
    if grid is not None:
        h.update(np.ascontiguousarray(grid, dtype=np.int64).data)
    return h.digest()


def _now() -> float:
    import time

    return time.monotonic()
