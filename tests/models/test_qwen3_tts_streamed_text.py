"""Text streamed into Qwen3-TTS: the talker reads it in the model's streaming-text mode as it
arrives (complete words only), waits where it has not, and speaks exactly what the same text
sent at once in that mode gives.

The embedded tiny CustomVoice checkpoint's three stages run in this process, driven as the
stage host drives them (the talker is stepped only while ``next_deadline`` says it can go on)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.models.tts_stages import loaded_stages, start, step
from worker.contract.options import RequestInput
from worker.contract.sampling import Sampling
from worker.stages.base import REQUEST_INPUT, RequestMeta
from worker.stages.payloads import TextPiece

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "configs" / "models" / "tiny-qwen3-tts.yaml"
WORDS = ["Hello", " there,", " my", " streaming", " friend."]
FRAMES = 40


@pytest.fixture(scope="module")
def stages(tmp_path_factory) -> Iterator[dict]:
    with loaded_stages(SPEC, tmp_path_factory.mktemp("tts")) as loaded:
        yield loaded


def _speak(stages: dict, rid: str, pieces: list[str], every: int, sampling: Sampling):
    """The text's first piece with the request, then one more every ``every`` talker steps, then
    its end: (pcm16 bytes, the talker step of the first frame, the step of the last piece)."""
    talker = stages["tts_engine"]
    meta = RequestMeta("speech", frozenset({"audio"}), speech_sampling=sampling)
    req = RequestInput("speech", text=pieces[0], voice="vivian", text_follows=True)
    start(stages, rid, meta, req, FRAMES, True)
    left = list(pieces[1:])
    pcm: list[bytes] = []
    first_frame = last_piece = None
    done = ended = False
    n = 0
    while not done:
        if n % every == 0 and not ended:
            if left:
                talker.feed(rid, REQUEST_INPUT, TextPiece(left.pop(0)))
            else:
                talker.end_stream(rid, REQUEST_INPUT, {})
                ended = True
            last_piece = n
        n += 1
        frame, done = step(stages, rid, pcm)
        if frame and first_frame is None:
            first_frame = n
    return b"".join(pcm), first_frame, last_piece


@pytest.mark.parametrize("sampling", [Sampling(temperature=0), Sampling(seed=4)], ids=str)
def test_streamed_text_speaks_early_and_equals_the_text_at_once(
    stages: dict, sampling: Sampling
) -> None:
    streamed, first, last = _speak(stages, "s", WORDS, every=3, sampling=sampling)
    at_once, _, _ = _speak(stages, "a", ["".join(WORDS)], every=1, sampling=sampling)
    assert first is not None and last is not None and first < last, (first, last)
    assert len(streamed) > 0 and streamed == at_once


def test_a_word_cut_in_two_waits_for_its_end(stages: dict) -> None:
    """Only complete words are read: ``"Hel" + "lo there"`` speaks as ``"Hello there"``."""
    greedy = Sampling(temperature=0)
    cut, _, _ = _speak(stages, "c", ["Hel", "lo th", "ere"], every=2, sampling=greedy)
    whole, _, _ = _speak(stages, "w", ["Hello there"], every=1, sampling=greedy)
    assert cut == whole
    assert np.frombuffer(cut, "<i2").size > 0
