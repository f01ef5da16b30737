"""The CPU platform's replacements of SGLang's per-layer machinery and kernels equal SGLang's
own path (fp32): the decoder stack (``worker/engines/sglang/cpu_stack.py``: norms, rope, the
MoE as grouped matrix multiplies) against SGLang's model forward, and the paged attention
backend (``cpu_attention.py``: one call per layer for a batch) against SGLang's
``torch_native`` backend, on forwards the engine really ran: a prefill of several prompts, a
prefill whose prompt continues a cached prefix, a mixed batch (a prompt's chunk beside running
decodes) and decode steps of requests of different lengths.

Two models, one after the other in this process (one SGLang engine at a time): the tiny
Qwen3-Omni thinker (Qwen3-MoE layers, 3-D rope, deepstack) and a plain dense Qwen3 (the
families' other decoders: the TTS talker, the ASR decoder, plain language models)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from planner.spec import DType
from tests.plain_lm import build_plain_lm
from worker.engines.base import EngineRequest

REPO = Path(__file__).resolve().parents[1]


class Recorded:
    """The engine with every forward it runs computed again right after (the pool and the
    request table as they were: later requests take over freed slots): by SGLang's own model
    forward, and layer 0's attention by both backends."""

    def __init__(self, engine: Any) -> None:
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

        from worker.engines.sglang import cpu_stack
        from worker.engines.sglang.cpu_attention import PagedAttention

        self.runner = runner = engine.scheduler.tp_worker.model_runner
        model = runner.model
        self.text_model = getattr(model, "thinker", model).model
        layer = self.text_model.layers[0].self_attn.attn
        ours, theirs = PagedAttention(runner), TorchNativeAttnBackend(runner)
        # (kind, the stack's logits, SGLang's), (kind, layer 0 on ours, on SGLang's)
        self.logits: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        self.attention: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        forward = runner.forward

        def recording(forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
            mode = forward_batch.forward_mode  # (the eager runner runs a mixed one as extend)
            kind = "decode" if mode.is_decode() else "mixed" if mode.is_mixed() else "extend"
            out = forward(forward_batch, *args, **kwargs)
            # (cloned: the sampler works on the logits in place)
            logits = out.logits_output.next_token_logits.clone()
            with cpu_stack.sglang_path():
                runner.attn_backend.init_forward_metadata(forward_batch)
                theirs_logits = forward(forward_batch).logits_output.next_token_logits.clone()
            self.logits.append((kind, logits, theirs_logits))
            tokens = forward_batch.out_cache_loc.shape[0]
            q = torch.randn(tokens, layer.tp_q_head_num * layer.qk_head_dim)
            got = []
            for backend in (ours, theirs):
                backend.init_forward_metadata(forward_batch)
                call = backend.forward_decode if kind == "decode" else backend.forward_extend
                got.append(call(q, None, None, layer, forward_batch, save_kv_cache=False))
            self.attention.append((kind, got[0], got[1]))
            return out

        runner.forward = recording


def _engine(model_path: Path, chunk: int) -> Any:
    from worker.engines.sglang.engine import EngineSettings, SGLangEngine

    settings = EngineSettings(model_path=model_path, device="cpu", dtype=DType.FP32,
                              context_length=2048, max_running_requests=8, kv_tokens=0,
                              prefill_chunk_tokens=chunk)  # fmt: skip
    return SGLangEngine(settings)


def _checkpoint(name: str, tmp: Path) -> Path:
    if name == "plain-qwen3":
        return build_plain_lm(tmp / "plain")
    from planner.loader import load_spec
    from worker.models.checkpoint import resolve_checkpoint

    path = REPO / "configs" / "models" / "tiny-omni.yaml"
    return resolve_checkpoint(load_spec(path).spec, path, tmp / "cache", log=lambda _m: None)


@pytest.fixture(scope="module", params=["tiny-omni-thinker", "plain-qwen3"])
def recorded(request: pytest.FixtureRequest, tmp_path_factory: Any) -> Iterator[Recorded]:
    """The engine after it ran the batches the tests compare (32-token prefill chunks)."""
    engine = _engine(_checkpoint(request.param, tmp_path_factory.mktemp("ck")), chunk=32)
    rec = Recorded(engine)

    def run(reqs: list[EngineRequest]) -> None:
        for r in reqs:
            engine.submit(r)
        while engine.has_work():
            engine.step()

    def request(rid: str, ids: list[int], new: int) -> EngineRequest:
        return EngineRequest(rid, ids, new, stop_token_ids=frozenset())

    # several prompts prefilled together, then decoded at different lengths
    run([request(f"p{i}", [20 + (7 * i + k) % 200 for k in range(5 + 9 * i)], 6)
         for i in range(3)])  # fmt: skip
    # a turn continuing a cached prefix (its first 23 tokens served from the radix cache)
    run([request("turn", [20 + (7 * 2 + k) % 200 for k in range(23)] + [30, 31, 32], 4)])
    # a long prompt's 32-token chunks beside running decodes
    engine.submit(request("d0", [40, 41, 42], 12))
    engine.submit(request("d1", [50, 51, 52, 53, 54], 12))
    engine.step()
    engine.step()
    run([request("long", [60 + k % 150 for k in range(100)], 3)])
    yield rec
    engine.close()


@pytest.mark.parametrize("kind", ["extend", "decode", "mixed"])
def test_the_stack_equals_sglangs_forward(recorded: Recorded, kind: str) -> None:
    from worker.engines.sglang import cpu_stack

    assert cpu_stack._plan(recorded.text_model) is not None  # (the stack ran)
    compared = [(ours, theirs) for k, ours, theirs in recorded.logits if k == kind]
    assert compared, f"the engine ran no {kind} batch"
    for ours, theirs in compared:
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["extend", "decode", "mixed"])
def test_the_paged_attention_equals_sglangs_torch_native(recorded: Recorded, kind: str) -> None:
    """Layer 0's attention of every forward (random queries; the keys and values already in
    the pool) by the platform's backend and by SGLang's own ``torch_native``."""
    compared = [(ours, theirs) for k, ours, theirs in recorded.attention if k == kind]
    assert compared, f"the engine ran no {kind} batch"
    for ours, theirs in compared:
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
