"""The Qwen3-Omni talker's model class on SGLang: SGLang's scheduler and KV pool under the
talker's decoder, the project's own model class in SGLang's model registry.

``Qwen3OmniTalkerForSGLang`` is SGLang's ``Qwen3MoeForCausalLM`` (the talker's decoder is a
Qwen3-MoE decoder: attention with q/k norms and interleaved 3-D rope) whose sparse blocks also
carry the talker's shared expert under its sigmoid gate (as Qwen2-MoE's do), with the talker's
other parts beside it, transformers' own modules: the text and hidden projections and the code
predictor. The executor (``talker.TalkerExecutor``) builds each request's prompt; each
request's state is its ``talker._Request``, which the model finds by ``ForwardBatch.rids``:

- a prefill's inputs are the request's prompt embeddings and 3-D rope positions (the token ids
  SGLang holds for it are placeholders, so its prefix cache is off);
- a decode step's input is the frame of the first code picked last: the code predictor's
  passes run inside the step (``frame_inputs``), then the
  frame's code embeddings plus the thinker's text the request reads at that step go through
  the decoder, at the request's rope position;
- the next first code is picked in the model (``pick_first_codes``: the control codes
  suppressed, the request's sampler and generator) and handed to SGLang's sampler as the only
  finite logit: greedy there, it takes the pick (as transformers' ``generate`` picks it).

A request whose next thinker token has not arrived sits out the coming steps: the executor
holds it (``SGLangEngine.held``) and it keeps its KV outside the running batch. No CUDA graphs
yet: the forward reads per-request state in Python.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from worker.engines.sglang.talkers import handed_over, prompt_rows, row_ends
from worker.layers.talker_sampling import pick_codes, predictor_choice

ARCHITECTURE = "Qwen3OmniTalkerForSGLang"
# the checkpoint's tensors that SGLang's Qwen3-MoE decoder takes, and its names for them
_DECODER = {
    "talker.model.codec_embedding.": "model.embed_tokens.",
    "talker.model.layers.": "model.layers.",
    "talker.model.norm.": "model.norm.",
    "talker.codec_head.": "lm_head.",
}
_TEXT_KEYS = (
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "num_experts",
    "num_experts_per_tok",
    "norm_topk_prob",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "max_position_embeddings",
    "vocab_size",
    "hidden_act",
    "attention_bias",
)


def sglang_model_dir(checkpoint: Path, out: Path) -> Path:
    """A directory SGLang loads the talker from: the talker decoder's shape as a Qwen3-MoE
    config (what SGLang sizes its KV pool, attention and experts by; the rope's interleaved
    3-D sections in SGLang's names), the checkpoint's whole config under ``omni`` for the
    other parts, and the checkpoint's weight files linked (the other stages' tensors in them
    are passed over)."""
    from transformers import Qwen3OmniMoeConfig

    cfg = json.loads((checkpoint / "config.json").read_text())
    # (read through transformers: the checkpoint's names vary with the version that wrote it,
    # ``num_experts`` or ``num_local_experts``, ``rope_scaling`` or ``rope_parameters``)
    talker: Any = Qwen3OmniMoeConfig.from_dict(copy.deepcopy(cfg)).talker_config
    text = talker.text_config
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    moe = {k: getattr(text, k) for k in _TEXT_KEYS if hasattr(text, k)}
    moe |= {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3_moe",
        "rope_theta": float(rope.get("rope_theta") or getattr(text, "rope_theta", None) or 1e4),
        "rope_scaling": {
            "rope_type": "default",
            "mrope_section": rope["mrope_section"],
            "mrope_interleaved": bool(rope.get("interleaved", False)),
        },
        "tie_word_embeddings": False,
        "omni": cfg,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(moe))
    for f in checkpoint.iterdir():
        if f.is_file() and (f.suffix == ".safetensors" or f.name.endswith(".index.json")):
            (out / f.name).symlink_to(f.resolve())
    return out


def register() -> None:
    """The talker's model class in SGLang's registry (SGLang imported: ``vendor.load``)."""
    from sglang.srt.models.qwen2_moe import Qwen2MoeMLP
    from sglang.srt.models.qwen3_moe import Qwen3MoeForCausalLM, Qwen3MoeSparseMoeBlock
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.utils import add_prefix
    from transformers import Qwen3OmniMoeConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeTalkerForConditionalGeneration,
    )

    class SparseMoeWithSharedExpert(Qwen3MoeSparseMoeBlock):
        """SGLang's Qwen3-MoE routed experts plus the talker's shared expert, weighted by the
        sigmoid of its gate (Qwen2-MoE's block, whose fused gate is a Triton kernel)."""

        def __init__(self, layer_id: int, config: Any, quant_config: Any, prefix: str) -> None:
            super().__init__(layer_id, config, quant_config, prefix)
            self.shared_expert = Qwen2MoeMLP(
                hidden_size=config.hidden_size,
                intermediate_size=config.shared_expert_intermediate_size,
                hidden_act=config.hidden_act,
                quant_config=quant_config,
                reduce_results=False,  # (the layer's boundary sums it, as the experts')
                prefix=add_prefix("shared_expert", prefix),
            )
            self.shared_expert_gate = torch.nn.Linear(config.hidden_size, 1, bias=False)

        def forward_normal(self, hidden_states: torch.Tensor) -> torch.Tensor:
            # the shared part first: the routed experts may work in place on their input
            gate = torch.sigmoid(self.shared_expert_gate(hidden_states))
            shared = self.shared_expert(hidden_states) * gate
            return super().forward_normal(hidden_states) + shared

    class Qwen3OmniTalkerForSGLang(Qwen3MoeForCausalLM):
        def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
            super().__init__(config, quant_config, prefix)
            for i, layer in enumerate(self.model.layers):  # (SGLang's own blocks, replaced)
                layer.mlp = SparseMoeWithSharedExpert(
                    i, config, quant_config, add_prefix(f"model.layers.{i}.mlp", prefix)
                )
            omni = Qwen3OmniMoeConfig.from_dict(copy.deepcopy(config.omni))
            self.omni_config = omni
            tc: Any = copy.deepcopy(omni.talker_config)
            tc.text_config.num_hidden_layers = 0  # (the decoder is SGLang's)
            self.hf = Qwen3OmniMoeTalkerForConditionalGeneration(tc)
            self.hf.model.codec_embedding = self.model.embed_tokens  # one embedding, shared
            self.hf.codec_head = self.lm_head
            device = self.lm_head.weight.device
            self.suppress = suppressed_codes(torch, omni.talker_config, device)
            self.states: dict[str, Any] = {}  # the executor's running requests (talker._Request)

        def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
            own = dict(self.hf.named_parameters())
            decoder = []
            for name, w in weights:
                if not name.startswith("talker."):
                    continue  # the thinker's and code2wav's, in the same files
                prefix = next((k for k in _DECODER if name.startswith(k)), None)
                if prefix is not None:
                    decoder.append((_DECODER[prefix] + name[len(prefix) :], w))
                elif (key := name[len("talker.") :]) in own:
                    with torch.no_grad():
                        own[key].copy_(w.to(own[key].dtype))
                else:
                    raise ValueError(f"the talker has no tensor {name!r}")
            super().load_weights(decoder)

        @torch.no_grad()
        def forward(
            self,
            input_ids: torch.Tensor,
            positions: torch.Tensor,
            forward_batch: Any,
            input_embeds: Any = None,
            get_embedding: bool = False,
            pp_proxy_tensors: Any = None,
        ) -> Any:
            # (None: a request aborted since the scheduler built the batch; its row is unread)
            reqs = [self.states.get(rid) for rid in forward_batch.rids]
            w = self.lm_head.weight
            width = self.config.hidden_size
            if forward_batch.forward_mode.is_extend():
                rows = prompt_rows(forward_batch)
                chunks = list(zip(reqs, rows, strict=True))
                x = torch.cat([
                    r.prompt_embeds[0, s : s + n] if r else w.new_zeros(n, width)
                    for r, (s, n) in chunks
                ])  # fmt: skip
                # (an aborted row's stand-ins on the batch's device, as its batchmates' rows)
                at = torch.cat([
                    r.positions[:, s : s + n] if r else w.new_zeros((3, n), dtype=torch.long)
                    for r, (s, n) in chunks
                ], dim=1)  # fmt: skip
                h = row_ends(self.model(input_ids, at, forward_batch, x), rows)
                # (a long prompt's earlier chunks pick nothing)
                ready = [r is not None and s + n == r.positions.shape[1] for r, (s, n) in chunks]
            else:
                live = [i for i, r in enumerate(reqs) if r is not None]
                x = w.new_zeros(len(reqs), width)
                if live:
                    x[live] = frame_inputs(self.hf, self.model.embed_tokens, _rows(reqs, live))
                at = torch.tensor([r.pos + r.delta if r else 0 for r in reqs], device=w.device)
                h = self.model(input_ids, at.expand(3, -1), forward_batch, x)
                ready = [r is not None for r in reqs]
            picking = [i for i, ok in enumerate(ready) if ok]
            pickers = _rows(reqs, picking)
            for i, r in zip(picking, pickers, strict=True):
                r.past_hidden = h[i][None, None]
            codes = pick_first_codes(h[picking] @ w.T, self.suppress, pickers) if pickers else []
            picks = dict(zip(picking, codes, strict=True))
            return handed_over(picks, len(reqs), w.shape[0], w.device)

    ModelRegistry.models[ARCHITECTURE] = Qwen3OmniTalkerForSGLang


def _rows(reqs: list[Any], at: list[int]) -> list[Any]:
    """The requests at rows ``at`` (rows of requests still running)."""
    return [r for i in at if (r := reqs[i]) is not None]


# ---- the picks and the frame inputs the model computes in each step ---------------------------
def suppressed_codes(torch: Any, tc: Any, device: Any) -> Any:
    """The first codes ``generate`` never picks: the control codes (the vocabulary's last
    1,024) but end-of-speech."""
    vocab = tc.text_config.vocab_size
    suppress = torch.zeros(vocab, dtype=torch.bool, device=device)
    suppress[max(0, vocab - 1024) :] = True
    suppress[tc.codec_eos_token_id] = False
    return suppress


def pick_first_codes(logits: Any, suppress: Any, rows: list[Any]) -> list[int]:
    """Each row's next first code: the control codes suppressed, then its sampler (the
    repetition penalty over its first codes so far, and its draw)."""
    import torch

    logits = logits.float().masked_fill(suppress, float("-inf"))
    return pick_codes(torch, logits, [r.first_picks for r in rows])


def frame_inputs(talker: Any, codec_embed: Any, rows: list[Any]) -> Any:
    """The next step's input of each row (rows x H): the code predictor completes the frame
    whose first code the row picked last (``r.frame``, all its codes), and the frame's code
    embeddings plus the text the row reads at that step (``r.trailing``) are summed."""
    import torch

    dev = codec_embed.weight.device
    last = torch.tensor([[r.codes[-1]] for r in rows], device=dev)
    past = torch.cat([r.past_hidden for r in rows])
    residual = residual_codes(talker, codec_embed, past, last, rows)  # (B, groups - 1)
    predictor = talker.code_predictor
    frame_sum = codec_embed(last)[:, 0]
    for j in range(residual.shape[1]):
        frame_sum = frame_sum + predictor.model.codec_embedding[j](residual[:, j])
    for i, r in enumerate(rows):
        r.frame = np.array([[r.codes[-1], *residual[i].tolist()]], dtype=np.int64)
    return frame_sum + torch.stack([r.trailing for r in rows])


def residual_codes(talker: Any, codec_embed: Any, past: Any, first: Any, rows: list[Any]) -> Any:
    """The code predictor: codes 1..groups-1 of the frame whose first code is ``first``,
    from the talker's hidden state that predicted it, each picked by the rows' samplers."""
    import torch

    predictor = talker.code_predictor
    model = predictor.model
    picked = predictor_choice(torch, [r.rest_picks for r in rows])

    def choose(logits: Any) -> Any:
        return logits.argmax(-1) if picked is None else picked(logits)

    out = model(inputs_embeds=torch.cat([past, codec_embed(first)], dim=1), use_cache=True)
    codes = [choose(predictor.lm_head[0](out.last_hidden_state[:, -1]))]
    for j in range(1, talker.config.num_code_groups - 1):
        e = model.codec_embedding[j - 1](codes[-1])[:, None]
        out = model(inputs_embeds=e, cache=out.cache, use_cache=True)
        codes.append(choose(predictor.lm_head[j](out.last_hidden_state[:, -1])))
    return torch.stack(codes, dim=1)
