"""Qwen3-Omni's processor, assembled from the checkpoint's own pieces: its tokenizer and chat
template, its Whisper feature extractor and its Qwen2-VL image processor (the PIL backend:
the torchvision one does not load with the CPU torch these hosts use).

It does what ``Qwen3OmniMoeProcessor`` does for text, audio and images: features with their
lengths, patches with their grid sizes, and each placeholder expanded to one token per encoder
output (the audio count from transformers' own ``_get_feat_extract_output_lengths``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from worker.models.qwen3_omni.payloads import OmniPrompt
from worker.models.tokens import chat_text, token_id

AUDIO_RATE = 16_000


class OmniProcessor:
    def __init__(self, checkpoint: Path) -> None:
        from transformers import AutoTokenizer, Qwen2VLImageProcessorPil, WhisperFeatureExtractor
        from transformers.models.qwen3_omni_moe import processing_qwen3_omni_moe as official

        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        self.features = WhisperFeatureExtractor.from_pretrained(checkpoint)
        self.images = Qwen2VLImageProcessorPil.from_pretrained(checkpoint)
        self.audio_tokens = official._get_feat_extract_output_lengths
        self.n_window = official.Qwen3OmniMoeProcessor.n_window
        tok = self.tokenizer
        self.audio_token = token_id(tok, tok.audio_token)
        self.image_token = token_id(tok, tok.image_token)
        self.video_token = token_id(tok, tok.video_token)
        # Qwen3OmniMoeProcessor's own video sizes (min and max pixels per frame)
        video_size = official.Qwen3OmniMoeProcessor.videos_kwargs["size"]
        if not isinstance(video_size, dict):
            raise TypeError(f"Qwen3OmniMoeProcessor's video size is {video_size!r}, not a dict")
        self.video_size: dict[str, int] = video_size

    def chat_text(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> str:
        options: dict[str, Any] = {"tools": tools} if tools else {}
        return chat_text(self.tokenizer, messages, add_generation_prompt=True, **options)

    def prepare(
        self, messages: list[dict[str, Any]], tools: list[dict] | None = None
    ) -> OmniPrompt:
        """Messages whose content is a string or a list of parts: ``text``, ``audio`` (float32 at
        16 kHz under ``audio``) and ``image`` (uint8 HxWx3 under ``image``); ``tools`` (OpenAI's
        function definitions) go into the prompt through the chat template."""
        clips = [p["audio"] for p in media_parts(messages, "audio")]
        pictures = [p["image"] for p in media_parts(messages, "image")]
        ids = self.tokenizer.encode(self.chat_text(messages, tools), add_special_tokens=False)
        out = OmniPrompt(input_ids=[])
        counts: dict[int, list[int]] = {}
        if clips:
            feats = self.features(
                [np.asarray(c, dtype=np.float32) for c in clips],
                sampling_rate=AUDIO_RATE,
                padding="longest",  # what padding=True means; Whisper's __call__ is typed str
                truncation=False,
                return_attention_mask=True,
                return_tensors="np",
            )
            mask = feats["attention_mask"].astype(bool)
            lens = mask.sum(-1)
            # the tower takes every clip's valid frames concatenated along time
            frames = feats["input_features"].transpose(0, 2, 1)[mask].T
            out.audio_features = np.ascontiguousarray(frames, dtype=np.float32)
            out.audio_lens = [int(n) for n in lens]
            counts[self.audio_token] = [int(self.audio_tokens(n, self.n_window)) for n in lens]
        if pictures:
            from PIL import Image

            batch = self.images(
                [Image.fromarray(np.asarray(p)) for p in pictures], return_tensors="np"
            )
            out.pixel_values = np.asarray(batch["pixel_values"], dtype=np.float32)
            out.image_grid = np.asarray(batch["image_grid_thw"], dtype=np.int64)
            merge = int(self.images.merge_size) ** 2
            counts[self.image_token] = [int(g.prod()) // merge for g in out.image_grid]
        videos = media_parts(messages, "video")
        if videos:
            patched = [self.video_patches(v["video"], v.get("fps", 2.0)) for v in videos]
            out.video_values = np.concatenate([p for p, _, _ in patched])
            out.video_grid = np.stack([g for _, g, _ in patched])
            out.video_seconds = [s for _, _, s in patched]
            merge = int(self.images.merge_size) ** 2
            counts[self.video_token] = [int(g.prod()) // merge for g in out.video_grid]
        out.input_ids = _expand(ids, counts)
        return out

    def video_patches(
        self, frames: np.ndarray, fps: float, size: dict[str, int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """Frames (T, H, W, 3) uint8 -> (patches, grid t/h/w, seconds per temporal patch), the
        Qwen2-VL layout: frames resized to a multiple of patch x merge within the pixel bounds,
        rescaled and normalised like images, ``temporal_patch_size`` consecutive frames per patch
        (the last frame repeated to fill the final one)."""
        from PIL import Image
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        ip = self.images
        size = size or self.video_size
        ps, merge, tp = int(ip.patch_size), int(ip.merge_size), int(ip.temporal_patch_size)
        t, h, w = frames.shape[:3]
        rh, rw = smart_resize(
            h,
            w,
            factor=ps * merge,
            min_pixels=size["shortest_edge"],
            max_pixels=size["longest_edge"],
        )
        resized = np.stack(
            [
                np.asarray(Image.fromarray(f).resize((rw, rh), Image.Resampling.BICUBIC))
                for f in frames
            ]
        ).astype(np.float32)
        mean = np.asarray(ip.image_mean, np.float32)
        std = np.asarray(ip.image_std, np.float32)
        x = ((resized * float(ip.rescale_factor) - mean) / std).transpose(0, 3, 1, 2)  # T, C, H, W
        if t % tp:
            x = np.concatenate([x, np.repeat(x[-1:], tp - t % tp, axis=0)])
        gt, gh, gw = x.shape[0] // tp, rh // ps, rw // ps
        c = x.shape[1]
        x = x.reshape(gt, tp, c, gh // merge, merge, ps, gw // merge, merge, ps)
        x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        patches = np.ascontiguousarray(x.reshape(gt * gh * gw, c * tp * ps * ps), dtype=np.float32)
        return patches, np.array([gt, gh, gw], dtype=np.int64), tp / fps


def media_parts(messages: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [
        p
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if p.get("type") == kind
    ]


def _expand(ids: list[int], counts: dict[int, list[int]]) -> list[int]:
    """Each placeholder token, in order, repeated as many times as its input has tokens."""
    out: list[int] = []
    seen = dict.fromkeys(counts, 0)
    for t in ids:
        if t in counts:
            n = counts[t]
            if seen[t] >= len(n):
                raise ValueError("more placeholders than inputs in the chat template's output")
            out.extend([t] * n[seen[t]])
            seen[t] += 1
        else:
            out.append(t)
    for t, n in counts.items():
        if seen[t] != len(n):
            raise ValueError("the chat template dropped a media part")
    return out
