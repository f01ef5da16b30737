"""The thinker's model class in SGLang's model registry (registered by the thinker stage).

``Qwen3OmniThinker`` takes the place of SGLang's ``Qwen3OmniMoeForConditionalGeneration`` (the
architecture name in a Qwen3-Omni checkpoint's config.json), as SGLang-Omni registers its own:
- the encoders are not kept: their outputs come from the project's encoder stages, as SGLang's
  precomputed multimodal embeddings (``MultimodalDataItem.precomputed_embeddings``);
- what the talker is built on is captured on request (``capture``): each computed prompt
  position's hidden state at the talker's ``accept_hidden_layer`` (the output of the layer
  before, as transformers' ``hidden_states`` index it), read by the thinker stage after each
  prefill forward;
- the deepstack layer count follows the checkpoint (SGLang hard-codes 3,
  ``models/qwen3_vl_moe.py:63``; the tiny checkpoint has 2).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from sglang.srt.managers.mm_utils import prepare_mm_inputs
from sglang.srt.models.qwen3_omni_moe import Qwen3OmniMoeForConditionalGeneration
from sglang.srt.models.registry import ModelRegistry

_ENCODERS = ("thinker.audio_tower.", "thinker.visual.")


class Qwen3OmniThinker(Qwen3OmniMoeForConditionalGeneration):
    def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
        super().__init__(config, quant_config, prefix)
        thinker = self.thinker
        del thinker.audio_tower
        thinker.visual = None
        thinker.model.deepstack_embed_to_decoder_layer = range(thinker.num_deepstack_embeddings)
        self.accept_layer = int(config.talker_config.accept_hidden_layer)
        self.capture = False  # set by the stage before a forward whose prompts a talker needs
        self.captured: torch.Tensor | None = None  # hidden states of the positions computed
        self.forward = self._forward  # (the parent binds the thinker's forward per instance)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights((n, w) for n, w in weights if not n.startswith(_ENCODERS))

    def _forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: Any,
        get_embedding: bool = False,
        pp_proxy_tensors: Any = None,
    ) -> Any:
        t = self.thinker
        if t.is_mrope_enabled:
            positions = forward_batch.mrope_positions
        extra: dict[str, Any] = {}
        embeds = prepare_mm_inputs(
            input_ids, forward_batch, t.model, extra, t, use_deepstack=t.use_deepstack
        )
        capture = self.capture and forward_batch.forward_mode.is_extend()
        t.model.layers_to_capture = [self.accept_layer] if capture else []
        out = t.model(
            input_ids=None,
            positions=positions,
            forward_batch=forward_batch,
            input_embeds=embeds,
            **extra,
        )
        if capture:
            out, aux = out
            self.captured = self._before_deepstack(aux[0], extra)
        return t.logits_processor(input_ids, out, t.lm_head, forward_batch)

    def _before_deepstack(self, hidden: torch.Tensor, extra: dict[str, Any]) -> torch.Tensor:
        """The captured input of layer ``accept`` is the output of layer ``accept - 1`` plus,
        at visual positions, that layer's deepstack features; transformers' ``hidden_states``
        record a layer's output before them (the reference the talker was trained on)."""
        deepstack = extra.get("input_deepstack_embeds")
        layer = self.accept_layer - 1
        if deepstack is None or layer not in self.thinker.model.deepstack_embed_to_decoder_layer:
            return hidden
        width = hidden.shape[-1]
        return hidden - deepstack[:, layer * width : (layer + 1) * width]


def register() -> None:
    """The thinker's model class in SGLang's registry (SGLang imported: ``vendor.load``)."""
    ModelRegistry.models["Qwen3OmniMoeForConditionalGeneration"] = Qwen3OmniThinker
