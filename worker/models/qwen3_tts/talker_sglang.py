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
  request reads at that frame go through the decoder (``next_inputs``);
- the next first code is picked in the model too (``FirstCodes``: the official masks,
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from worker.contract.sampling import SamplerState
from worker.engines.sglang.talkers import handed_over, prompt_rows, row_ends
from worker.layers.talker_sampling import (
    TalkerSampling,
    pick_codes,
    predictor_choice,
    sampled,
)
from worker.models.qwen3_tts.modeling import Qwen3TTSModel
from worker.models.qwen3_tts.prompt import Prompt, read_config

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


GREEDY = TalkerSampling(sampled(0.0, None, None, 1.05), sampled(0.0, None, None))


@dataclass
class TalkerRequest:
    rid: str
    prompt: Prompt
    max_new_tokens: int
    sampling: TalkerSampling = GREEDY
    hidden: torch.Tensor | None = None  # (1, 1, H): last talker output
    token: int | None = None  # the first code waiting for its frame
    generated: list[int] = field(default_factory=list)  # first codes so far
    frames: int = 0
    done: bool = False
    first: SamplerState | None = None  # how its first codes are picked (set by prefill)
    rest: SamplerState | None = None  # how the code predictor's are
    frame: torch.Tensor | None = None  # the frame a step produced

    def samplers(self) -> tuple[SamplerState, SamplerState]:
        """How its first codes and its code predictor's are picked (set by the prefill)."""
        if self.first is None or self.rest is None:
            raise RuntimeError(f"talker request {self.rid} picked before its prefill")
        return self.first, self.rest

    def last_hidden(self) -> torch.Tensor:
        """The talker's output at its last position (1, 1, H), which its prefill left."""
        if self.hidden is None:
            raise RuntimeError(f"talker request {self.rid} stepped before its prefill")
        return self.hidden


class FirstCodes:
    """How a frame's first code is picked, as the official generate does: the codes above the
    codebook suppressed but end-of-speech, which waits for two frames (``suppress_tokens``,
    ``min_new_tokens``), then each request's talker sampling."""

    def __init__(self, talker_config: dict[str, Any]) -> None:
        self.eos = talker_config["codec_eos_token_id"]
        vocab = talker_config["vocab_size"]
        self.suppress = torch.ones(vocab, dtype=torch.bool)
        self.suppress[: vocab - 1024] = False
        self.suppress[self.eos] = False
        self.min_new_tokens = 2
        self._on: dict[torch.device, torch.Tensor] = {}  # the mask on each device it met

    def masked(self, logits: torch.Tensor, generated: list[list[int]]) -> torch.Tensor:
        """First-code logits (B, vocab), each row with the official generate's masks given
        the codes its request generated so far (the sampler applies the rest)."""
        suppress = self._on.get(logits.device)
        if suppress is None:
            suppress = self._on[logits.device] = self.suppress.to(logits.device)
        logits = logits.float().masked_fill(suppress, float("-inf"))
        young = [i for i, g in enumerate(generated) if len(g) < self.min_new_tokens]
        if young:
            logits[young, self.eos] = float("-inf")
        return logits

    def pick(self, logits: torch.Tensor, reqs: list[TalkerRequest]) -> list[int]:
        """logits (B, vocab) -> each request's next first code, recorded in it (``token``,
        ``generated``, ``done`` at end-of-speech or its budget)."""
        logits = self.masked(logits, [r.generated for r in reqs])
        codes = pick_codes(torch, logits, [r.samplers()[0] for r in reqs])
        for r, code in zip(reqs, codes, strict=True):
            r.generated.append(code)
            r.token = code
            if code == self.eos or len(r.generated) >= r.max_new_tokens:
                r.done = True
        return codes


def next_inputs(talker: Any, reqs: list[TalkerRequest], first: torch.Tensor) -> tuple[Any, Any]:
    """The frames of the requests' waiting first codes ``first`` (B,) and the talker's next
    inputs: the code predictor fills in each frame's other groups from the request's last
    talker output, then the sum of the frame's code embeddings plus the text the request reads
    at that frame (its ``trailing`` text, then the pad). -> frames (B, groups), inputs (B, 1,
    H); each request's ``frames`` counts the frame."""
    hidden = torch.cat([r.last_hidden() for r in reqs], dim=0)
    choose = predictor_choice(torch, [r.samplers()[1] for r in reqs])
    rest = talker.code_predictor.predict(hidden, talker.codec_embed(first)[:, None], choose)
    frames = torch.cat([first[:, None], rest], dim=1)
    adds = []
    for r in reqs:
        tr = r.prompt.trailing
        adds.append(tr[:, r.frames] if r.frames < tr.shape[1] else r.prompt.pad[:, 0])
        r.frames += 1
    return frames, talker.frame_embed(frames) + torch.stack(adds, dim=0)
