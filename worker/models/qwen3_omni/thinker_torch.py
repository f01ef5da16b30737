"""The project's own engine (``worker.engines.torch_lm``) under the Qwen3-Omni thinker
(``engine.backend: transformers``): transformers' MoE language model, with the thinker's own
prompts and positions.

Prefill follows the real model: token embeddings with the encoders' outputs scattered in at
their placeholders, the vision encoder's deepstack features added in the first layers, and the
3-D (temporal, height, width) rope positions of ``get_rope_index``; decode steps then advance
every running request by one token, each at its own ``position + rope delta``. While
``capture`` is set, a prefill also keeps the prompt's hidden states at the talker's
``accept_hidden_layer`` in ``captured`` for the ``on_forward`` callback, as the SGLang model
class does.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from worker.engines.base import ForwardTrace
from worker.engines.torch_lm import LMRequest, TorchLMEngine
from worker.models.qwen3_omni.common import load, on_device
from worker.stages.base import StageContext
from worker.stages.generation_config import stop_tokens


class TorchThinkerEngine(TorchLMEngine):
    def __init__(
        self, ctx: StageContext, on_forward: Callable[[ForwardTrace], None] | None = None
    ) -> None:
        import torch

        self.config, self.thinker = load(ctx)
        lm = self.thinker.model.language_model
        tc = self.config.thinker_config
        # the checkpoint's suppressed tokens, masked before the sampler and the log
        # probabilities (the executor's stop tokens come with each request)
        stops = stop_tokens(ctx.component_dir(), getattr(tc.text_config, "eos_token_id", None), ())
        vocab = self.thinker.lm_head.weight.shape[0]
        suppress = stops.suppress_mask(torch, vocab, ctx.device) if stops.suppress else None
        super().__init__(ctx, lm, lm.embed_tokens, vocab, suppress, on_forward)
        self.audio_id, self.image_id = tc.audio_token_id, tc.image_token_id
        self.video_id = tc.video_token_id
        self.accept = self.config.talker_config.accept_hidden_layer
        self.capture = False  # set by the stage before a step whose prompts a talker needs
        self.captured: Any = None  # the last prefill's hidden states at ``accept``

    # ---- prefill ---------------------------------------------------------------------------
    def _prefill_forward(self, r: LMRequest) -> tuple[Any, Any]:
        torch = self.torch
        dev = self.ctx.device
        p = r.req.multimodal or {}
        ids = torch.tensor([r.req.input_ids], device=dev)
        n = ids.shape[1]
        embeds = self.embed(ids)
        embeds = self._scatter(embeds, ids == self.audio_id, p.get("audio_embeds"), "audio")
        image_mask, video_mask = ids == self.image_id, ids == self.video_id
        embeds = self._scatter(embeds, image_mask, p.get("image_embeds"), "image")
        embeds = self._scatter(embeds, video_mask, p.get("video_embeds"), "video")
        visual_mask, deepstack = self._deepstack(p, image_mask[0], video_mask[0], embeds.dtype)
        lens = p.get("audio_lens") or None
        image_grid, video_grid = p.get("image_grid"), p.get("video_grid")
        positions, deltas = self.thinker.model.get_rope_index(
            ids,
            image_grid_thw=torch.from_numpy(image_grid).to(dev) if image_grid is not None else None,
            video_grid_thw=torch.from_numpy(video_grid).to(dev) if video_grid is not None else None,
            attention_mask=torch.ones_like(ids),
            audio_seqlens=torch.tensor(lens, device=dev) if lens else None,
            second_per_grids=torch.tensor(p["video_seconds"], device=dev)
            if video_grid is not None
            else None,
        )
        text_pos = torch.arange(n, device=dev).view(1, 1, n)
        out = self.model(
            inputs_embeds=embeds,
            position_ids=torch.cat([text_pos, positions]),
            use_cache=True,
            output_hidden_states=self.capture,
            deepstack_visual_embeds=deepstack,
            visual_pos_masks=visual_mask,
        )
        if self.on_forward is not None:
            self.captured = out.hidden_states[self.accept][0] if self.capture else None
            self.on_forward(ForwardTrace([r.rid], [n], True))
        r.delta = int(deltas.view(-1)[0])
        return self.thinker.lm_head(out.last_hidden_state[:, -1]), out.cache

    def _deepstack(
        self, p: dict[str, Any], image_mask: Any, video_mask: Any, dtype: Any
    ) -> tuple[Any, Any]:
        """The vision encoder's deepstack features at the visual positions (images and video
        frames in prompt order), added to the first decoder layers' hidden states."""
        torch = self.torch
        image, video = p.get("image_deepstack"), p.get("video_deepstack")
        present = [d for d in (image, video) if d is not None]
        if not present:
            return None, None
        visual = image_mask | video_mask
        layers = []
        for i in range(len(present[0])):
            joint = torch.zeros(
                int(visual.sum()), self.embed.weight.shape[1], dtype=dtype, device=visual.device
            )
            if image is not None:
                joint[image_mask[visual]] = on_device(image[i], joint.device, joint.dtype)
            if video is not None:
                joint[video_mask[visual]] = on_device(video[i], joint.device, joint.dtype)
            layers.append(joint)
        return visual[None], layers

    def _scatter(self, embeds: Any, mask: Any, values: Any, what: str) -> Any:
        if values is None:
            if bool(mask.any()):
                raise ValueError(f"the prompt has {what} placeholders but no {what} input")
            return embeds
        values = on_device(values, embeds.device, embeds.dtype)
        if int(mask.sum()) != values.shape[0]:
            raise ValueError(
                f"{int(mask.sum())} {what} placeholders for {values.shape[0]} embeddings"
            )
        return embeds.masked_scatter(mask[..., None].expand_as(embeds), values)

    # ---- decode ----------------------------------------------------------------------------
    def _decode_forward(
        self, inputs_embeds: Any, attention_mask: Any, position_ids: Any, cache: Any, **_: Any
    ) -> Any:
        """One decode step in the shape KVBatch expects: text positions for the mask, rope
        positions shifted by each row's delta."""
        rope = (position_ids + self.deltas[:, None])[None].expand(3, -1, -1)
        out = self.model(
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            position_ids=self.torch.cat([position_ids[None], rope]),
            cache=cache,
            use_cache=True,
        )
        return SimpleNamespace(logits=self.thinker.lm_head(out.last_hidden_state), cache=out.cache)
