"""The Qwen3-TTS talker within the plan's KV pool: an admitted request holds its prompt's
positions and its whole frame budget, a request waits (first come, first served) until that
much is free, and a prompt that could never fit is refused as over the context.

The embedded tiny CustomVoice checkpoint's stages run in this process, driven as the stage host
drives them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.models.tts_stages import loaded_stages, start
from worker.contract.options import RequestInput
from worker.contract.sampling import Sampling
from worker.stages.base import DONE, INVALID, RequestMeta

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "configs" / "models" / "tiny-qwen3-tts.yaml"
FRAMES = 6
META = RequestMeta("speech", frozenset({"audio"}), speech_sampling=Sampling(temperature=0.0))


@pytest.fixture(scope="module")
def stages(tmp_path_factory) -> Iterator[dict]:
    with loaded_stages(SPEC, tmp_path_factory.mktemp("tts")) as loaded:
        yield loaded


def _start(stages: dict, rid: str, text: str) -> None:
    start(stages, rid, META, RequestInput("speech", text=text, voice="vivian"), FRAMES, False)


def _run(talker) -> tuple[list[tuple[int, set[str]]], dict[str, str]]:
    """Step until idle: (each step's running requests, each request's end: done or the error)."""
    seen, ends = [], {}
    n = 0
    while talker.next_deadline() is not None:
        for kind, rid, data in talker.step():
            if kind in (DONE, INVALID):
                ends[rid] = kind if kind == DONE else data
        seen.append((n, set(talker.running)))
        n += 1
    return seen, ends


def test_a_request_waits_for_room_in_the_kv_pool(
    stages: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    talker = stages["tts_engine"]
    kv = talker.kv_tokens
    built: list[str] = []
    build = talker.builder.build
    monkeypatch.setattr(
        talker.builder, "build", lambda text, **kw: built.append(text) or build(text, **kw)
    )
    try:
        talker.kv_tokens = 0
        _start(stages, "probe", "Hello there.")
        talker.step()
        held = talker.running["probe"].kv_need
        _run(talker)
        # room for one such request and a bit, not two: the second waits for the first
        talker.kv_tokens = held + held // 2
        _start(stages, "first", "Hello there.")
        _start(stages, "second", "Hello there.")
        seen, ends = _run(talker)
        assert ends == {"first": DONE, "second": DONE}
        assert all(len(running) <= 1 for _, running in seen)
        first_done = next(n for n, running in seen if "first" not in running)
        assert any("second" in running for n, running in seen if n >= first_done)
        assert len(built) == 3  # (each prompt built once, the second's while it waited)
        # with room for both they run side by side
        talker.kv_tokens = 2 * held
        _start(stages, "third", "Hello there.")
        _start(stages, "fourth", "Hello there.")
        seen, ends = _run(talker)
        assert any(running == {"third", "fourth"} for _, running in seen)
    finally:
        talker.kv_tokens = kv


def test_a_prompt_over_the_kv_pool_is_refused_as_over_the_context(stages: dict) -> None:
    talker = stages["tts_engine"]
    kv = talker.kv_tokens
    try:
        talker.kv_tokens = 8
        _start(stages, "long", "A sentence that takes more than eight positions to say.")
        _, ends = _run(talker)
        assert "exceeds the context length 8 that this stage's KV pool holds" in ends["long"]
        assert not talker.running and not talker.pending
    finally:
        talker.kv_tokens = kv
