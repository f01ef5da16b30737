"""The Qwen3-Omni thinker in this process on the tiny checkpoint: it admits requests within the
plan's KV pool (``kv_tokens``: a request that does not fit waits until a running one leaves;
one that could never fit is refused with the context-length error; the shipped specs'
32,768-token context lets one long video in, the pool of 65,536 tokens bounds what runs at
once), and honours ``logit_bias`` and ``logprobs``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.spec import ModelSpec
from worker.models.checkpoint import resolve_checkpoint
from worker.stages.base import CHUNK, INVALID, RequestMeta, StageContext
from worker.stages.registry import make_executor
from worker.stages.sampling import Sampling

SPEC = Path(__file__).resolve().parents[2] / "configs" / "models" / "tiny-omni.yaml"


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory):
    spec = ModelSpec.model_validate(yaml.safe_load(SPEC.read_text()))
    ck = resolve_checkpoint(spec, SPEC, tmp_path_factory.mktemp("omni"), log=lambda _m: None)
    ctx = StageContext("thinker", spec, spec.stages["thinker"], ck, "cpu", 8, kv_tokens=50)
    ex = make_executor(ctx)
    ex.load()
    return ex


def prompt(n: int) -> dict:
    return {"preprocessing": {"input_ids": list(range(10, 10 + n)), "audio_lens": []}}


def test_requests_wait_for_room_in_the_kv_pool(thinker) -> None:
    meta = RequestMeta("chat", frozenset({"text"}), max_tokens=4)
    thinker.start("a", meta, prompt(30))
    thinker.start("b", meta, prompt(30))
    thinker.step()
    assert set(thinker.running) == {"a"} and [r.rid for r in thinker.pending] == ["b"]
    while "a" in thinker.running:
        thinker.step()
    thinker.step()
    assert "b" in thinker.running or not thinker.pending  # admitted once a left
    while thinker.running or thinker.pending:
        thinker.step()
    thinker.start("huge", meta, prompt(55))
    outs = thinker.step()
    assert [(kind, rid) for kind, rid, _ in outs] == [(INVALID, "huge")]
    assert "exceeds the context length" in outs[0][2]


def run(thinker, rid: str, meta: RequestMeta) -> list[dict]:
    thinker.start(rid, meta, prompt(8))
    chunks = []
    while thinker.running or thinker.pending:
        chunks += [data for kind, r, data in thinker.step() if kind == CHUNK and r == rid]
    return chunks


def test_logit_bias_and_logprobs(thinker) -> None:
    greedy = [t for c in run(thinker, "g", RequestMeta("chat", frozenset({"text"}), 6))
              for t in c["tokens"]]  # fmt: skip
    forced = greedy[0] + 1
    meta = RequestMeta("chat", frozenset({"text"}), 6,
                       sampling=Sampling(logit_bias=((forced, 100.0),)))  # fmt: skip
    assert {t for c in run(thinker, "b", meta) for t in c["tokens"]} == {forced}
    meta = RequestMeta("chat", frozenset({"text"}), 6, logprobs=3)
    chunks = [c for c in run(thinker, "l", meta) if c["tokens"]]
    assert [c["tokens"][0] for c in chunks] == greedy
    for c in chunks:
        ((lp, rivals),) = c["logprobs"]
        assert len(rivals) == 3 and rivals[0] == (c["tokens"][0], pytest.approx(lp))
        assert lp <= 0 and rivals[0][1] >= rivals[1][1] >= rivals[2][1]


SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "size": {"enum": ["S", "M", "L"]},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "size", "ok"],
    "additionalProperties": False,
}


def test_a_json_schema_is_met_by_a_random_weight_model(thinker) -> None:
    """Constrained decoding (xgrammar): the random tiny model's reply parses and fits."""
    import json

    from transformers import AutoTokenizer

    from worker.stages.grammar import Grammar

    tok = AutoTokenizer.from_pretrained(thinker.ctx.checkpoint)
    for sampling in (Sampling(), Sampling(temperature=1.0, seed=3)):
        meta = RequestMeta("chat", frozenset({"text"}), 64, sampling=sampling,
                           grammar=Grammar("json_schema", json.dumps(SCHEMA)))  # fmt: skip
        tokens = [t for c in run(thinker, "j", meta) for t in c["tokens"]]
        doc = json.loads(tok.decode(tokens, skip_special_tokens=True))
        assert set(doc) == {"color", "size", "ok"} and isinstance(doc["ok"], bool)
        assert doc["color"] in ("red", "green", "blue") and doc["size"] in ("S", "M", "L")
    meta = RequestMeta("chat", frozenset({"text"}), 24, grammar=Grammar("json"))
    text = tok.decode([t for c in run(thinker, "o", meta) for t in c["tokens"]])
    assert text.startswith("{")  # (a free JSON object may not end within 24 tokens)
