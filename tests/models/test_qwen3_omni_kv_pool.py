"""The Qwen3-Omni thinker admits requests within the plan's KV pool (``kv_tokens``): a request
that does not fit waits until a running one leaves; one that could never fit is refused with
the context-length error. (The shipped specs' 32,768-token context lets one long video in, the
pool of 65,536 tokens bounds what runs at once.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.spec import ModelSpec
from worker.models.checkpoint import resolve_checkpoint
from worker.stages.base import INVALID, RequestMeta, StageContext
from worker.stages.registry import make_executor

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
