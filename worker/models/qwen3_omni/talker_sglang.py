"""The Qwen3-Omni talker on SGLang (``engine.backend: sglang``): SGLang's scheduler and KV pool
under the talker's decoder, the project's own model class in SGLang's model registry.

``Qwen3OmniTalkerForSGLang`` is SGLang's ``Qwen3MoeForCausalLM`` (the talker's decoder is a
Qwen3-MoE decoder: attention with q/k norms and interleaved 3-D rope) whose sparse blocks also
carry the talker's shared expert under its sigmoid gate (as Qwen2-MoE's do), with the talker's
other parts beside it, transformers' own modules: the text and hidden projections and the code
predictor. The executor is the torch one's (``talker.TalkerExecutor``: the same requests, the
same prompt) with SGLang under it; each request's state is its ``_Request``, which the model
finds by ``ForwardBatch.rids``:

- a prefill's inputs are the request's prompt embeddings and 3-D rope positions (the token ids
  SGLang holds for it are placeholders, so its prefix cache is off);
- a decode step's input is the frame of the first code picked last: the code predictor's
  passes run inside the step (``talker.frame_inputs``, as on the torch engine), then the
  frame's code embeddings plus the thinker's text the request reads at that step go through
  the decoder, at the request's rope position;
- the next first code is picked in the model (``talker.pick_first_codes``: the control codes
  suppressed, the request's sampler and generator) and handed to SGLang's sampler as the only
  finite logit: greedy there, it takes the pick. Greedy or seeded, the codes are the torch
  engine's.

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

import torch

from worker.engines.sglang.talkers import (
    handed_over,
    held_tensors,
    prompt_rows,
    row_ends,
    talker_engine,
)
from worker.models.qwen3_omni.talker import (
    TalkerExecutor,
    _Request,
    frame_inputs,
    pick_first_codes,
    suppressed_codes,
)
from worker.models.stage_weights import LoadReport
from worker.stages.base import CHUNK, INVALID, Output
from worker.stages.sampling import Sampling

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
            self.states: dict[str, _Request] = {}  # the executor's running requests

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
                at = torch.cat([
                    r.positions[:, s : s + n] if r else torch.zeros(3, n, dtype=torch.long)
                    for r, (s, n) in chunks
                ], dim=1).to(w.device)  # fmt: skip
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


def _rows(reqs: list[_Request | None], at: list[int]) -> list[_Request]:
    """The requests at rows ``at`` (rows of requests still running)."""
    return [r for i in at if (r := reqs[i]) is not None]


class SGLangTalkerExecutor(TalkerExecutor):
    """The talker's executor with SGLang's scheduler under it: a step submits the requests it
    admits and runs SGLang until they are prefilled (every other request held), then one
    decode step of the ready requests (the others held)."""

    def _load_talker(self) -> tuple[Any, Any]:
        from worker.engines import sglang as vendor

        vendor.load()
        register()
        self.engine, self.model_dir = talker_engine(self.ctx, sglang_model_dir)
        self.model: Any = self.engine.model
        self.ctx.extra["loaded"] = LoadReport(*held_tensors(self.model), ())  # (gpu_check)
        return self.model.omni_config, self.model.hf

    def load(self) -> None:
        super().load()
        self.model.states = self.running  # what the model reads is what runs
        self.pad = int(self.tc.codec_pad_id)
        self.starting: list[_Request] = []  # submitted this step, not prefilled yet

    def abort(self, rid: str) -> None:
        self.pending = [r for r in self.pending if r.rid != rid]
        if self.running.pop(rid, None) is not None:
            self.engine.abort(rid)

    def _fits(self, r: _Request, positions: int) -> bool:
        """Its prompt and every frame it may add beside what the running requests may still
        take: SGLang never has to retract a talker's row (which it would prefill again from
        placeholder ids)."""
        taken = sum(x.positions.shape[1] + x.max_new for x in self.running.values())
        return taken + positions + r.max_new <= self.engine.pool_tokens

    def _prefill(self, r: _Request) -> list[Output]:
        """Submit ``r``: its prompt (the placeholder ids SGLang holds for it, the embeddings
        and rope positions the model reads), its frames to come at most."""
        from worker.engines.base import EngineRequest

        r.prompt_embeds, positions = self._prompt(r)
        r.positions = positions.long()  # (transformers' rope index may be floats)
        r.pos = r.prompt_embeds.shape[1]
        self.running[r.rid] = r
        self.engine.submit(
            EngineRequest(
                r.rid,
                [self.pad] * r.pos,
                max_new_tokens=r.max_new,
                sampling=Sampling(temperature=0.0),  # (it takes the model's pick)
                stop_token_ids=frozenset({self.eos}),
            )
        )
        self.starting.append(r)
        return []

    def _prefilled(self) -> list[Output]:
        outs: list[Output] = []
        while self.starting:
            if not self.engine.has_work():
                raise RuntimeError("the talker's prompts were not prefilled")
            outs += self._run({r.rid for r in self.starting}, [])
            self.starting = [r for r in self.starting if not r.codes and r.rid in self.running]
        return outs

    def _step(self, rows: list[_Request]) -> list[Output]:
        for r in rows:
            r.trailing = self._trailing(r, len(r.codes) - 1)
        return self._run({r.rid for r in rows}, rows)

    def _run(self, stepping: set[str], fed: list[_Request]) -> list[Output]:
        """One engine step of the ``stepping`` requests (the others held): the frames ``fed``
        in (a decode step's rows) come out first, then each pick; a request that picked
        end-of-speech or reached its frames ends."""
        self.engine.held = {rid for rid in self.running if rid not in stepping}
        events = self.engine.step()
        outs: list[Output] = []
        for r in fed:
            if r.frame is None:
                raise RuntimeError(f"talker request {r.rid} was not stepped")
            outs.append((CHUNK, r.rid, {"codes": r.frame}))
            r.frame = None
            r.frames += 1
            r.pos += 1
        for ev in events:
            req = self.running.get(ev.rid)
            if req is None:
                continue
            req.codes.extend(ev.tokens)
            if ev.finish == "abort":
                del self.running[req.rid]
                outs.append((INVALID, req.rid, f"{self.ctx.name}: {ev.error}"))
            elif ev.finish is not None:
                outs += self._finish(req)
        return outs
