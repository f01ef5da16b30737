"""Turn detection on real speech (espeak-ng's, tests/spoken.py) with the real models: Silero VAD
under ``server_vad``, Smart Turn v3 under ``semantic_vad`` (worker/api/realtime/turns.py).
bench/bench_vad.py measures the same against WebRTC's detector and says what each costs."""

from __future__ import annotations

import numpy as np
import pytest
from spoken import RATE, pcm16, spoken
from spoken import SENTENCES as ALL_SENTENCES

from worker.api.realtime.config import EAGERNESS, VadConfig
from worker.api.realtime.events import TurnDetectionIn
from worker.api.realtime.turns import ServerVad, SpeechStarted, SpeechStopped, smart_turn
from worker.layers.resample import resample

SENTENCES = ALL_SENTENCES[:10]
BREAK_MS = 800  # a pause inside a sentence: longer than server_vad's 500 ms of silence


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), np.float32)


async def turns(config: VadConfig, samples: np.ndarray) -> tuple[ServerVad, list]:
    vad = ServerVad(config)
    pcm = pcm16(samples)
    found = []
    for at in range(0, len(pcm), 960):  # 20 ms appends
        found += await vad.feed(pcm[at : at + 960])
    return vad, found


def test_smart_turn_scores_as_pipecats_own_analyzer() -> None:
    """The probability is Pipecat's ``LocalSmartTurnAnalyzerV3``'s on the same audio (its
    features and its padding or cut to the last 8 s), short and long turns alike."""
    from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3

    reference = LocalSmartTurnAnalyzerV3(sample_rate=16_000)
    for text in ["what is the", SENTENCES[0], " ".join(SENTENCES[:4])]:  # (the last: over 8 s)
        x = resample(spoken(text), RATE, 16_000)
        want = reference._predict_endpoint(x)["probability"]
        assert smart_turn().complete(x) == pytest.approx(want, abs=1e-6), text


@pytest.mark.parametrize("eagerness", ["medium", "high"])
async def test_semantic_vad_ends_a_turn_as_smart_turn_scores_its_pause(eagerness: str) -> None:
    """Twenty utterances, each of the sentences whole and with an 800 ms pause in its middle,
    then 2.5 s of silence: each pause of 160 ms or more is scored once by Smart Turn; where it
    scores the turn complete (at least the eagerness's threshold) the eagerness's short silence
    ends the turn, else only its longest one does (longer than the 800 ms pause: a pause the
    model hears as unfinished never ends the turn). server_vad, for contrast, ends every turn
    at the 800 ms pause."""
    eager = EAGERNESS[eagerness]
    semantic = VadConfig().patched(TurnDetectionIn(type="semantic_vad", eagerness=eagerness))
    assert semantic.silence_duration_ms == eager.longest_ms > BREAK_MS
    ended_mid = ended_soon = 0
    for i, sentence in enumerate(SENTENCES * 2):
        words = sentence.split()
        paused = i >= len(SENTENCES)
        if paused:
            half = len(words) // 2
            text = f"{' '.join(words[:half])} <break time='{BREAK_MS}ms'/> {' '.join(words[half:])}"
        else:
            text = sentence
        speech = spoken(text + ".")
        samples = np.concatenate([silence(0.6), speech, silence(2.5)])
        vad, found = await turns(semantic, samples)
        assert isinstance(found[0], SpeechStarted) and isinstance(found[-1], SpeechStopped)
        stops = [t for t in found if isinstance(t, SpeechStopped)]
        for stop in stops:
            score = max((s for s in vad.scores if s[0] <= stop.until), default=(0, 0.0))[1]
            waited_ms = (stop.until - stop.at) * 1000 / RATE
            wait = eager.complete_ms if score >= eager.complete else eager.longest_ms
            assert wait <= waited_ms <= wait + 100, (sentence, vad.scores, stop)
        speech_end = (0.6 * RATE + speech.size) - 0.1 * RATE
        ended_mid += any(stop.at < speech_end for stop in stops)
        ended_soon += not paused and stops[-1].until - stops[-1].at < eager.longest_ms * RATE / 1000
        if paused:
            _, server = await turns(VadConfig(), samples)
            assert [type(t) for t in server].count(SpeechStopped) == 2  # (the pause ends it)
    print(
        f"semantic_vad {eagerness}: a turn ended inside its sentence in {ended_mid} of "
        f"{2 * len(SENTENCES)}; a finished sentence ended after {eager.complete_ms} ms of "
        f"silence in {ended_soon} of {len(SENTENCES)}"
    )


async def test_server_vad_finds_each_turn_within_100_ms() -> None:
    """Ten sentences, each alone between 1.2 s of silence: one turn each, starting and ending
    within 100 ms of where espeak's speech does."""
    for sentence in SENTENCES:
        speech = spoken(sentence + ".")
        samples = np.concatenate([silence(1.2), speech, silence(1.2)])
        _, found = await turns(VadConfig(), samples)
        assert [type(t) for t in found] == [SpeechStarted, SpeechStopped], sentence
        start, end = 1.2 * RATE, 1.2 * RATE + speech.size
        assert abs(found[0].at - start) * 1000 / RATE <= 100, sentence
        assert abs(found[1].at - end) * 1000 / RATE <= 100, sentence
