"""The Qwen3-TTS talker on SGLang: SGLang's scheduler and KV pool under the talker's decoder,
the project's own model class in SGLang's model registry.

``Qwen3TTSTalkerForSGLang`` is SGLang's ``Qwen3ForCausalLM`` (the talker's decoder is a Qwen3
decoder: SGLang's attention over its paged KV pool) with the talker's other parts beside it:
the text embedding and projection, the code predictor and, on Base checkpoints, the speaker
encoder (the project's modules, ``modeling``). Each request's state is its ``TalkerRequest``,
registered with the model by request id (``states``); a forward finds its rows' requests by
``ForwardBatch.rids``:

- a prefill's inputs are the request's prompt embeddings (the token ids SGLang holds for it
  are placeholders, so its prefix cache is off);
- a decode step's input is the frame of the code just picked: the code predictor's 15 passes
  run inside the step (from the request's last talker output and that code, each pass picked by
  the request's sub-talker sampling), then the frame's code embeddings plus the text the
  request reads at that frame go through the decoder (``engine.next_inputs``);
- the next first code is picked in the model too (``engine.FirstCodes``: the official masks,
  the request's own sampler and generator), and handed to SGLang's sampler as the only finite
  logit: greedy there, it takes the pick.

A request reading streamed text sits out the steps its next word has not reached: the stage
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

from worker.contract.stage_context import StageContext
from worker.engines.sglang.talkers import (
    handed_over,
    held_tensors,
    prompt_rows,
    row_ends,
    talker_engine,
)
from worker.layers.stage_weights import LoadReport
from worker.models.qwen3_tts.engine import (
    GREEDY,
    FirstCodes,
    Prompt,
    PromptBuilder,
    TalkerRequest,
    next_inputs,
    read_config,
)
from worker.models.qwen3_tts.modeling import Qwen3TTSModel
from worker.stages.talker_sampling import TalkerSampling

ARCHITECTURE = "Qwen3TTSTalkerForSGLang"
# the checkpoint's tensors that SGLang's Qwen3 decoder takes, and its names for them
_DECODER = {
    "talker.model.codec_embedding.": "model.embed_tokens.",
    "talker.model.layers.": "model.layers.",
    "talker.model.norm.": "model.norm.",
    "talker.codec_head.": "lm_head.",
}


def sglang_model_dir(checkpoint: Path, out: Path) -> Path:
    """A directory SGLang loads the talker from: the talker decoder's shape as a Qwen3 config
    (what SGLang sizes its KV pool and attention by; the talker's three rope sections take one
    position each for speech, which is Qwen3's rope), the checkpoint's whole config under
    ``tts`` for the other parts, and the checkpoint's weight files linked."""
    cfg = read_config(checkpoint)
    tc = cfg["talker_config"]
    heads = tc["num_attention_heads"]
    qwen3 = {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "hidden_size": tc["hidden_size"],
        "intermediate_size": tc["intermediate_size"],
        "num_hidden_layers": tc["num_hidden_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": tc.get("num_key_value_heads") or heads,
        "head_dim": tc.get("head_dim") or tc["hidden_size"] // heads,
        "rms_norm_eps": tc.get("rms_norm_eps", 1e-6),
        "rope_theta": float(tc.get("rope_theta", 10000.0)),
        "max_position_embeddings": tc.get("max_position_embeddings", 32768),
        "vocab_size": tc["vocab_size"],
        "hidden_act": tc.get("hidden_act", "silu"),
        "attention_bias": False,
        "tie_word_embeddings": False,
        "tts": cfg,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(qwen3))
    for f in checkpoint.iterdir():
        if f.is_file() and (f.suffix == ".safetensors" or f.name.endswith(".index.json")):
            (out / f.name).symlink_to(f.resolve())
    return out


def register() -> None:
    """The talker's model class in SGLang's registry (SGLang imported: ``vendor.load``)."""
    from sglang.srt.models.qwen3 import Qwen3ForCausalLM
    from sglang.srt.models.registry import ModelRegistry

    class Qwen3TTSTalkerForSGLang(Qwen3ForCausalLM):
        def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
            super().__init__(config, quant_config, prefix)
            rest = copy.deepcopy(config.tts)
            rest["talker_config"]["num_hidden_layers"] = 0  # (the decoder is SGLang's)
            self.tts = Qwen3TTSModel(rest)
            talker = self.tts.talker
            talker.model.codec_embedding = self.model.embed_tokens  # one embedding, shared
            talker.codec_head = self.lm_head
            self.codes = FirstCodes(config.tts["talker_config"])
            self.states: dict[str, TalkerRequest] = {}

        def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
            own = dict(self.tts.named_parameters()) | dict(self.tts.named_buffers())
            decoder = []
            for name, w in weights:
                prefix = next((k for k in _DECODER if name.startswith(k)), None)
                if prefix is not None:
                    decoder.append((_DECODER[prefix] + name[len(prefix) :], w))
                elif name in own:
                    with torch.no_grad():
                        own[name].copy_(w.to(own[name].dtype))
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
            reqs = [self.states.get(rid) or self._gone(rid) for rid in forward_batch.rids]
            if forward_batch.forward_mode.is_extend():
                rows = prompt_rows(forward_batch)
                chunks = list(zip(reqs, rows, strict=True))
                x = torch.cat([r.prompt.embeds[0, s : s + n] for r, (s, n) in chunks])
                h = row_ends(self.model(input_ids, positions, forward_batch, x), rows)
                # (a long prompt's earlier chunks pick nothing)
                ready = [s + n == r.prompt.embeds.shape[1] for r, (s, n) in chunks]
            else:
                frames, x = next_inputs(self.tts.talker, reqs, input_ids)
                for r, frame in zip(reqs, frames, strict=True):
                    r.frame = frame
                h = self.model(input_ids, positions, forward_batch, x[:, 0])
                ready = [True] * len(reqs)
            picking = [i for i, ok in enumerate(ready) if ok]
            for i in picking:
                reqs[i].hidden = h[i][None, None]
            w = self.lm_head.weight
            picks = self.codes.pick(h[picking] @ w.T, [reqs[i] for i in picking]) if picking else []
            return handed_over(
                dict(zip(picking, picks, strict=True)), len(reqs), w.shape[0], w.device
            )

        def _gone(self, rid: str) -> TalkerRequest:
            """A row of a request aborted since the scheduler built the batch (its result is
            dropped): a greedy stand-in."""
            hidden = self.lm_head.weight.new_zeros(1, 1, self.config.hidden_size)
            prompt = Prompt(hidden, hidden[:, :0], hidden)
            r = TalkerRequest(rid, prompt, 1, GREEDY, hidden=hidden)
            r.first, r.rest = GREEDY.states(torch, hidden.device)
            return r

    ModelRegistry.models[ARCHITECTURE] = Qwen3TTSTalkerForSGLang


class SGLangTalkerEngine:
    """The talker's engine on SGLang: ``prefill`` submits a request (SGLang prefills those of
    a step together), ``step`` runs the prefills then one decode step of the given requests,
    the others held."""

    def __init__(self, ctx: StageContext) -> None:
        from worker.engines import sglang as vendor

        vendor.load()
        register()
        self.engine, self.model_dir = talker_engine(ctx, sglang_model_dir)
        self.model: Any = self.engine.model
        ctx.extra["loaded"] = LoadReport(*held_tensors(self.model), ())  # (gpu_check)
        self.eos = self.model.codes.eos
        self.pad = int(self.model.config.tts["talker_config"]["codec_pad_id"])
        self.device = self.model.lm_head.weight.device
        self.waiting: list[TalkerRequest] = []  # submitted, not prefilled yet

    @property
    def tts(self) -> Qwen3TTSModel:
        """The talker's parts beside the decoder (prompts are built with them)."""
        return self.model.tts

    def prefill(self, req: TalkerRequest) -> None:
        from worker.contract.sampling import Sampling
        from worker.engines.base import EngineRequest

        req.first, req.rest = req.sampling.states(torch, self.device)
        self.model.states[req.rid] = req
        n = int(req.prompt.embeds.shape[1])
        self.engine.submit(
            EngineRequest(
                req.rid,
                [self.pad] * n,
                max_new_tokens=req.max_new_tokens,
                sampling=Sampling(temperature=0.0),  # (it takes the model's pick)
                stop_token_ids=frozenset({self.eos}),
            )
        )
        self.waiting.append(req)

    def step(self, reqs: list[TalkerRequest]) -> list[tuple[TalkerRequest, torch.Tensor]]:
        # the new prompts first, every running request held: those steps can only prefill
        new = {r.rid for r in self.waiting}
        self.engine.held = {rid for rid in self.model.states if rid not in new}
        while self.waiting:
            if not self.engine.has_work():
                raise RuntimeError("the talker's prompts were not prefilled")
            self._finish(self.engine.step())
            self.waiting = [r for r in self.waiting if not r.generated and not r.done]
        stepping = {r.rid for r in reqs}
        running = [r for r in reqs if not r.done]
        if not running:
            return []
        self.engine.held = {rid for rid in self.model.states if rid not in stepping}
        self._finish(self.engine.step())
        out = []
        for r in running:
            if r.frame is None:
                raise RuntimeError(f"talker request {r.rid} was not stepped")
            out.append((r, r.frame))
            r.frame = None
        return out

    def close(self) -> None:
        self.engine.close()

    def abort(self, req: TalkerRequest) -> None:
        self.engine.abort(req.rid)
        self.model.states.pop(req.rid, None)
        self.waiting = [r for r in self.waiting if r.rid != req.rid]

    def _finish(self, events: list[Any]) -> None:
        for ev in events:
            r = self.model.states.get(ev.rid)
            if r is not None and ev.finish is not None:
                r.done = True
                self.model.states.pop(ev.rid)


def generate(
    engine: SGLangTalkerEngine,
    builder: PromptBuilder,
    texts: list[dict[str, Any]],
    max_new_tokens: int,
    sampling: TalkerSampling = GREEDY,
) -> list[torch.Tensor]:
    """Whole-utterance generation for several requests at once on ``engine`` (greedy by
    default, as the reference tests compare): each one's codes (frames, groups)."""
    reqs = []
    for i, kw in enumerate(texts):
        kw = dict(kw)
        text = kw.pop("text")
        r = TalkerRequest(f"generate-{i}", builder.build(text, **kw), max_new_tokens, sampling)
        engine.prefill(r)
        reqs.append(r)
    out: dict[str, list[torch.Tensor]] = {r.rid: [] for r in reqs}
    while running := [r for r in reqs if not r.done]:
        for r, frame in engine.step(running):
            out[r.rid].append(frame)
    groups = engine.tts.config["talker_config"]["num_code_groups"]
    return [
        torch.stack(out[r.rid]) if out[r.rid] else torch.zeros(0, groups, dtype=torch.long)
        for r in reqs
    ]
