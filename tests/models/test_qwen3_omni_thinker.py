"""The Qwen3-Omni thinker in this process on the tiny checkpoint, on SGLang's scheduler (closed
at the module's end: SGLang runs one engine at a time in a process): it admits requests within the
plan's KV pool (``kv_tokens``: a request that does not fit waits until a running one leaves;
one that could never fit is refused with the context-length error; the shipped specs'
32,768-token context lets one long video in, the pool of 65,536 tokens bounds what runs at
once), and honours ``logit_bias``, ``logprobs`` and ``response_format``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from planner.spec import ModelSpec
from worker.contract.sampling import Sampling
from worker.contract.stage_context import StageContext
from worker.models.checkpoint import resolve_checkpoint
from worker.models.qwen3_omni.payloads import OmniPrompt
from worker.models.registry import make_executor
from worker.stages.base import CHUNK, DONE, INVALID, RequestMeta

SPEC = Path(__file__).resolve().parents[2] / "configs" / "models" / "tiny-omni.yaml"


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    raw = yaml.safe_load(SPEC.read_text())
    raw["stages"]["thinker"]["engine"]["prefill_chunk_tokens"] = 64
    spec = ModelSpec.model_validate(raw)
    ck = resolve_checkpoint(spec, SPEC, tmp_path_factory.mktemp("omni"), log=lambda _m: None)
    ctx = StageContext("thinker", spec, spec.stages["thinker"], ck, "cpu", 8, kv_tokens=400)
    ex = make_executor(ctx)
    ex.load()
    yield ex
    ex.close()


def drain(thinker) -> list[tuple]:
    """Every output until the thinker is idle."""
    outs: list[tuple] = []
    while thinker.next_deadline() is not None:
        outs += thinker.step()
    return outs


def prompt(n: int, first: int = 10) -> dict[str, OmniPrompt]:
    """``n`` text tokens counting up from ``first`` (within the tiny vocabulary's bytes)."""
    ids = [32 + (first + i) % 200 for i in range(n)]
    return {"preprocessing": OmniPrompt(ids)}


def test_requests_wait_for_room_in_the_kv_pool(thinker) -> None:
    meta = RequestMeta("chat", frozenset({"text"}), max_tokens=4)
    thinker.start("a", meta, prompt(210))
    thinker.start("b", meta, prompt(210, first=110))  # (no prefix shared with a's)
    order = [(kind, rid) for kind, rid, _ in drain(thinker) if kind in (CHUNK, DONE)]
    # b's first token comes after a is done: both rows (210 + 4 tokens each) exceed the pool
    assert order.index((CHUNK, "b")) > order.index((DONE, "a"))
    assert (DONE, "b") in order
    thinker.start("huge", meta, prompt(410))
    outs = drain(thinker)
    assert [(kind, rid) for kind, rid, _ in outs] == [(INVALID, "huge")]
    assert "exceeds the context length" in outs[0][2]


def run(thinker, rid: str, meta: RequestMeta) -> list:
    thinker.start(rid, meta, prompt(8))
    return [data for kind, r, data in drain(thinker) if kind == CHUNK and r == rid]


def test_logit_bias_and_logprobs(thinker) -> None:
    greedy = [t for c in run(thinker, "g", RequestMeta("chat", frozenset({"text"}), 6))
              for t in c.tokens]  # fmt: skip
    forced = greedy[0] + 1
    meta = RequestMeta("chat", frozenset({"text"}), 6,
                       sampling=Sampling(logit_bias=((forced, 100.0),)))  # fmt: skip
    assert {t for c in run(thinker, "b", meta) for t in c.tokens} == {forced}
    meta = RequestMeta("chat", frozenset({"text"}), 6, logprobs=3)
    chunks = [c for c in run(thinker, "l", meta) if c.tokens]
    assert [c.tokens[0] for c in chunks] == greedy
    for c in chunks:
        ((lp, rivals),) = c.logprobs
        assert len(rivals) == 3 and rivals[0] == (c.tokens[0], pytest.approx(lp))
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

    from worker.contract.grammar import Grammar

    tok = AutoTokenizer.from_pretrained(thinker.ctx.checkpoint)
    for sampling in (Sampling(), Sampling(temperature=1.0, seed=3)):
        meta = RequestMeta("chat", frozenset({"text"}), 64, sampling=sampling,
                           grammar=Grammar("json_schema", json.dumps(SCHEMA)))  # fmt: skip
        tokens = [t for c in run(thinker, "j", meta) for t in c.tokens]
        doc = json.loads(tok.decode(tokens, skip_special_tokens=True))
        assert set(doc) == {"color", "size", "ok"} and isinstance(doc["ok"], bool)
        assert doc["color"] in ("red", "green", "blue") and doc["size"] in ("S", "M", "L")
    meta = RequestMeta("chat", frozenset({"text"}), 24, grammar=Grammar("json"))
    text = tok.decode([t for c in run(thinker, "o", meta) for t in c.tokens])
    assert text.startswith("{")  # (a free JSON object may not end within 24 tokens)


def test_penalties_change_the_greedy_reply_and_count_the_prompt(thinker) -> None:
    """Frequency, presence and repetition penalties each change what a random model repeats;
    the repetition penalty counts the prompt's tokens too, as transformers' processor does
    (SGLang's counts the reply's only: ``patches._repetition_penalty_over_the_prompt``): the
    penalized greedy reply is transformers' ``generate``'s with the same penalty."""
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    text = frozenset({"text"})
    greedy = [t for c in run(thinker, "p", RequestMeta("chat", text, 24)) for t in c.tokens]
    assert len(set(greedy)) < len(greedy), greedy  # the random model repeats itself
    penalized = {}
    for name, sampling in (
        ("frequency", Sampling(frequency_penalty=1.5)),
        ("presence", Sampling(presence_penalty=1.5)),
        ("repetition", Sampling(repetition_penalty=1.8)),
    ):
        meta = RequestMeta("chat", text, 24, sampling=sampling)
        penalized[name] = [t for c in run(thinker, name, meta) for t in c.tokens]
        assert penalized[name] != greedy, name
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        thinker.ctx.checkpoint, dtype=torch.float32
    ).thinker
    ids = torch.tensor([prompt(8)["preprocessing"].input_ids])
    reference = model.generate(ids, max_new_tokens=24, do_sample=False, repetition_penalty=1.8)
    assert penalized["repetition"] == reference[0, ids.shape[1] :].tolist()


def test_a_repeated_prefix_is_served_from_the_cache(thinker) -> None:
    """The radix cache: a prompt that starts as an earlier one did computes only what is new,
    and says how much it reused (decode and usage get ``cached_tokens``); so does a text prompt
    that a talker needs (it reads text positions by their embeddings), every position still
    given to the talker."""
    meta = RequestMeta("chat", frozenset({"text"}), max_tokens=2)
    first = prompt(60, first=60)
    thinker.start("p1", meta, first)
    thinker.start("p0", meta, prompt(20, first=160))  # (unrelated)
    drain(thinker)
    ids = [*first["preprocessing"].input_ids[:50], 5, 6, 7]
    thinker.start("p2", meta, {"preprocessing": OmniPrompt(ids)})
    outs = drain(thinker)
    head = next(d for kind, rid, d in outs if kind == CHUNK and rid == "p2")
    done = next(d for kind, rid, d in outs if kind == DONE and rid == "p2")
    assert head.cached_tokens == done["cached_tokens"] == 50
    assert done["prompt_tokens"] == 53
    spoken = RequestMeta("chat", frozenset({"text", "audio"}), max_tokens=2,
                         stream_targets=("decode", "talker"))  # fmt: skip
    thinker.start("p3", spoken, {"preprocessing": OmniPrompt(ids)})
    outs = drain(thinker)
    head = next(d for kind, rid, d in outs if kind == CHUNK and rid == "p3")
    assert head.cached_tokens == 52  # (all but the last: its logits start the reply)
    assert head.talker_prompt.hidden.shape[0] == head.talker_prompt.embeds.shape[0] == 53


def test_a_long_prompt_is_prefilled_in_chunks_beside_running_decodes(thinker) -> None:
    """Chunked prefill mixed with decode: while a 300-token prompt is prefilled 64 tokens a
    step, the running request still gets a token every step."""
    thinker.start("run", RequestMeta("chat", frozenset({"text"}), max_tokens=40),
                  prompt(8, first=185))  # fmt: skip
    while not any(kind == CHUNK for kind, _, _ in thinker.step()):
        pass
    thinker.start("long", RequestMeta("chat", frozenset({"text"}), max_tokens=2),
                  prompt(300, first=35))  # fmt: skip
    steps = 0
    while True:
        outs = thinker.step()
        steps += 1
        assert any(kind == CHUNK and rid == "run" for kind, rid, _ in outs), steps
        if any(kind == CHUNK and rid == "long" for kind, rid, _ in outs):
            break
    assert steps >= 300 // 64  # (the prompt went in chunks)
    drain(thinker)


def test_seeded_draws_do_not_depend_on_the_batch(thinker) -> None:
    """A seeded request draws the same tokens alone and beside others that change how SGLang
    samples a batch (a greedy one, a top-k one; and a long prompt's chunks mixed in)."""
    sampled = RequestMeta("chat", frozenset({"text"}), 24,
                          sampling=Sampling(temperature=1.0, seed=21))  # fmt: skip
    alone = [t for c in run(thinker, "s1", sampled) for t in c.tokens]
    thinker.start("g", RequestMeta("chat", frozenset({"text"}), 24), prompt(12, first=140))
    thinker.start("k", RequestMeta("chat", frozenset({"text"}), 24,
                                   sampling=Sampling(temperature=1.0, top_k=5, seed=2)),
                  prompt(9, first=125))  # fmt: skip
    thinker.start("s2", sampled, prompt(8))
    thinker.start("long", RequestMeta("chat", frozenset({"text"}), 2), prompt(200, first=95))
    beside = [t for kind, rid, d in drain(thinker) if kind == CHUNK and rid == "s2"
              for t in d.tokens]  # fmt: skip
    assert beside == alone and len(set(alone)) > 3
