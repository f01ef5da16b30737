"""Qwen3-Omni's multimodal prompt in SGLang's own form (``MultimodalInputs``), for the thinker on
SGLang: the encoders' outputs (from the encoder stages) as precomputed embeddings, one item per
clip or image keyed by a hash of its content (so an image repeated in a later turn matches the
cached prefix), and the prompt's 3-D rope positions from SGLang's own
``get_rope_index_qwen3_omni``."""

from __future__ import annotations

from typing import Any

from worker.models.qwen3_omni.common import on_device
from worker.models.qwen3_omni.payloads import MediaEmbeddings, OmniPrompt


def multimodal_inputs(tc: Any, ids: list[int], p: OmniPrompt, media: MediaEmbeddings) -> Any:
    """SGLang's ``MultimodalInputs`` for the encoders' outputs ``media`` of the prompt ``p``
    (None for a text prompt): one precomputed item per contiguous run of placeholders, the deepstack
    features of images and video frames appended to their embeddings (as SGLang's vision
    path lays them out), and the prompt's 3-D rope positions."""
    import torch
    from sglang.srt.layers.rotary_embedding.mrope import MRotaryEmbedding
    from sglang.srt.managers.schedule_batch import (
        Modality,
        MultimodalDataItem,
        MultimodalInputs,
    )

    t = torch.tensor(ids, dtype=torch.long)
    items: list[Any] = []
    kinds = (
        (Modality.AUDIO, tc.audio_token_id, "audio"),
        (Modality.IMAGE, tc.image_token_id, "image"),
        (Modality.VIDEO, tc.video_token_id, "video"),
    )
    for modality, token, what in kinds:
        where = (t == token).nonzero()[:, 0].tolist()
        values = getattr(media, what)
        if values is None:
            if where:
                raise ValueError(f"the prompt has {what} placeholders but no {what} input")
            continue
        values = on_device(values, "cpu", torch.float32)
        if len(where) != values.shape[0]:
            raise ValueError(f"{len(where)} {what} placeholders for {values.shape[0]} embeddings")
        deep = getattr(media, f"{what}_deepstack", None)
        if deep is not None:  # (layers, n, hidden) -> (n, hidden * (1 + layers))
            deep = on_device(deep, "cpu", torch.float32)
            values = torch.cat([values, *deep], dim=-1)
        at = 0
        for start, end in _runs(where):
            item = MultimodalDataItem(
                modality=modality,
                offsets=[(start, end)],
                precomputed_embeddings=values[at : at + end - start + 1],
            )
            item.set_pad_value()
            items.append(item)
            at += end - start + 1
    if not items:
        return None
    grid = {"image_grid": p.image_grid, "video_grid": p.video_grid}
    lens = p.audio_lens or None
    positions, delta = MRotaryEmbedding.get_rope_index_qwen3_omni(
        spatial_merge_size=tc.vision_config.spatial_merge_size,
        image_token_id=tc.image_token_id,
        video_token_id=tc.video_token_id,
        vision_start_token_id=tc.vision_start_token_id,
        tokens_per_second=getattr(tc.vision_config, "tokens_per_second", None),
        input_ids=t[None],
        image_grid_thw=_tensor(grid["image_grid"]),
        video_grid_thw=_tensor(grid["video_grid"]),
        second_per_grid_ts=torch.tensor(p.video_seconds)
        if grid["video_grid"] is not None
        else None,
        audio_token_id=tc.audio_token_id,
        audio_start_token_id=tc.audio_start_token_id,
        position_id_per_seconds=tc.position_id_per_seconds,
        audio_seqlens=torch.tensor(lens) if lens else None,
        use_audio_in_video=False,
    )
    return MultimodalInputs(
        mm_items=items,
        im_token_id=tc.image_token_id,
        video_token_id=tc.video_token_id,
        audio_token_id=tc.audio_token_id,
        mrope_positions=positions.squeeze(1),
        mrope_position_delta=delta.reshape(-1, 1),
    )


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """Contiguous runs of sorted positions as inclusive (start, end) pairs."""
    runs: list[tuple[int, int]] = []
    for i in positions:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def _tensor(value: Any) -> Any:
    import torch

    return None if value is None else torch.as_tensor(value)
