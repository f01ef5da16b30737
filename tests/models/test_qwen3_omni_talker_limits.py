"""The Qwen3-Omni talker within the plan's KV pool, as the thinker: a reply's talker row that
does not fit beside the running ones waits until one leaves; one that could never fit is
refused with the context-length error. The tiny checkpoint's talker runs in this process on
SGLang with a KV pool of 60 tokens (closed at the module's end: one SGLang engine at a time),
fed as the thinker feeds it (its prompt states, then its reply's tokens and embeddings)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from planner.spec import ModelSpec
from worker.contract.sampling import Sampling
from worker.contract.stage_context import StageContext
from worker.models.checkpoint import resolve_checkpoint
from worker.models.qwen3_omni.payloads import OmniPrompt, TalkerPrompt, ThinkerPiece
from worker.models.registry import make_executor
from worker.stages.base import CHUNK, DONE, INVALID, RequestMeta

SPEC = Path(__file__).resolve().parents[2] / "configs" / "models" / "tiny-omni.yaml"
FRAMES = 4


@pytest.fixture(scope="module")
def talker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    spec = ModelSpec.model_validate(yaml.safe_load(SPEC.read_text()))
    ck = resolve_checkpoint(spec, SPEC, tmp_path_factory.mktemp("omni"), log=lambda _m: None)
    # one row of a 40-token user turn (and its frames), not two
    ctx = StageContext("talker", spec, spec.stages["talker"], ck, "cpu", 8, kv_tokens=60)
    ex = make_executor(ctx)
    ex.load()
    yield ex
    ex.close()


def _reply(talker, rid: str, words: int) -> None:
    """A spoken reply to a user turn of ``words`` text tokens, fed whole."""
    cfg = talker.config
    ids = [cfg.im_start_token_id, cfg.user_token_id, *([10] * words), cfg.im_end_token_id]
    ids += [cfg.im_start_token_id, cfg.assistant_token_id, 10]
    meta = RequestMeta("chat", frozenset({"audio"}), speech_sampling=Sampling(temperature=0.0))
    talker.start(rid, meta, {"preprocessing": OmniPrompt(ids)})
    zeros = np.zeros((len(ids), talker.tc.thinker_hidden_size), np.float32)
    first = TalkerPrompt(zeros, zeros, zeros[:3])
    talker.feed(rid, "thinker", ThinkerPiece([11] * 6, embeds=zeros[:6], talker_prompt=first))
    talker.end_stream(rid, "thinker", {"finish_reason": "stop"})
    talker.pending[-1].max_new = FRAMES


def _drain(talker) -> list[tuple]:
    outs: list[tuple] = []
    while talker.next_deadline() is not None:
        outs += talker.step()
    return outs


def test_a_reply_waits_for_room_in_the_kv_pool(talker) -> None:
    _reply(talker, "a", 40)
    _reply(talker, "b", 40)
    order = [(kind, rid) for kind, rid, _ in _drain(talker) if kind in (CHUNK, DONE)]
    assert order.index((CHUNK, "b")) > order.index((DONE, "a"))
    assert (DONE, "b") in order
    _reply(talker, "huge", 60)  # a user turn of 60 tokens can never fit
    outs = _drain(talker)
    assert [(kind, rid) for kind, rid, _ in outs] == [(INVALID, "huge")]
    assert "exceeds the context length 60 that this stage's KV pool holds" in outs[0][2]
