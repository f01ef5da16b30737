"""The Qwen3-Omni talker on SGLang picks the same codes whatever the pace of its input: five
replies on the tiny checkpoint, greedy and seeded (one at the checkpoint's temperature, one at
its own), stepped together, their thinker tokens streamed in one a step (so that each waits for
its next token at its own pace, held out of SGLang's batch meanwhile) or all given at once.
The talker runs in this process (closed at the module's end: one SGLang engine at a time)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "configs" / "models" / "tiny-omni.yaml"


@pytest.fixture(scope="module")
def talker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import yaml

    from planner.spec import ModelSpec
    from worker.contract.stage_context import StageContext
    from worker.models.checkpoint import resolve_checkpoint
    from worker.models.registry import make_executor

    spec = ModelSpec.model_validate(yaml.safe_load(SPEC.read_text()))
    ck = resolve_checkpoint(spec, SPEC, tmp_path_factory.mktemp("omni"), log=lambda _m: None)
    ctx = StageContext("talker", spec, spec.stages["talker"], ck, "cpu", 8, kv_tokens=4096)
    ex = make_executor(ctx)
    ex.load()
    yield ex
    ex.close()


def _frames(talker: Any, paced: bool) -> dict[str, Any]:
    """Each reply's frames (or its refusal), its thinker tokens fed one a step (``paced``) or
    all at once."""
    import numpy as np

    from worker.contract.sampling import Sampling
    from worker.models.qwen3_omni.payloads import OmniPrompt, TalkerPrompt, ThinkerPiece
    from worker.stages.base import CHUNK, END, INVALID, RequestMeta

    cfg, width = talker.config, talker.tc.thinker_hidden_size
    greedy = Sampling(temperature=0.0)
    replies = [  # (id, user words, speech sampling, thinker tokens, seed of the inputs)
        ("greedy-short", 5, greedy, 10, 0),
        ("greedy-long", 9, greedy, 30, 1),
        ("seeded", 7, Sampling(seed=5), 20, 2),
        ("greedy-as-seeded", 7, greedy, 20, 2),
        ("seeded-warm", 3, Sampling(seed=9, temperature=0.7), 6, 3),
    ]
    streams: dict[str, list[Any]] = {}  # id -> [its thinker embeddings, how many fed]
    for rid, words, sampling, tokens, n in replies:
        ids = [cfg.im_start_token_id, cfg.user_token_id, *([10] * words), cfg.im_end_token_id]
        ids += [cfg.im_start_token_id, cfg.assistant_token_id, 10]
        meta = RequestMeta("chat", frozenset({"audio"}), speech_sampling=sampling)
        talker.start(rid, meta, {"preprocessing": OmniPrompt(ids)})
        rng = np.random.default_rng(n)
        prompt = rng.standard_normal((2, len(ids), width)).astype(np.float32)
        embeds = rng.standard_normal((tokens, width)).astype(np.float32)
        first = TalkerPrompt(prompt[0], prompt[1], embeds[:3])
        given = 2 if paced else tokens
        piece = ThinkerPiece(list(range(11, 11 + given)), embeds=embeds[:given])
        piece.talker_prompt = first
        talker.feed(rid, "thinker", piece)
        streams[rid] = [embeds, given]
    out: dict[str, Any] = {}
    read: dict[str, int] = {}  # the text positions each reply's talker read
    while True:
        for rid, stream in streams.items():
            embeds, fed = stream
            if fed < len(embeds):
                talker.feed(rid, "thinker", ThinkerPiece([11 + fed], embeds=embeds[fed : fed + 1]))
            elif fed == len(embeds):
                talker.end_stream(rid, "thinker", {"finish_reason": "stop"})
            stream[1] = fed + 1
        if talker.next_deadline() is None and all(s[1] > len(s[0]) for s in streams.values()):
            return {
                "frames": out,
                "read": read,
                "tokens": {r: len(s[0]) for r, s in streams.items()},
            }
        for kind, rid, data in talker.step():
            if kind == CHUNK:
                out.setdefault(rid, []).append(data.codes.tolist())
            elif kind == END:
                read[rid] = data["text_tokens_read"]
            elif kind == INVALID:
                out[rid] = data


def test_the_talkers_codes_do_not_depend_on_the_pace_of_its_input(talker: Any) -> None:
    paced, whole = _frames(talker, paced=True), _frames(talker, paced=False)
    assert paced == whole
    frames = paced["frames"]
    assert all(isinstance(f, list) and len(f) >= 2 for f in frames.values()), frames
    assert frames["seeded"] != frames["greedy-as-seeded"]  # (the same inputs: sampled)
    # Each text position read once, as it came: the reply's first token in the prompt, then one
    # a frame (its tokens, then end-of-text) while there are any: min(frames, tokens) + 1.
    read, tokens = paced["read"], paced["tokens"]
    want = {rid: min(len(f), tokens[rid]) + 1 for rid, f in frames.items()}
    assert read == want
    assert any(len(frames[rid]) > tokens[rid] for rid in frames), "no reply read its whole text"
