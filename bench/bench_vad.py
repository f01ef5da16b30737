#!/usr/bin/env python3
"""Turn detection, measured: Silero VAD (what ``server_vad`` runs, worker/api/realtime/turns.py)
beside WebRTC's detector (what it ran before, as it ran it), on the same espeak-ng speech.

    python bench/bench_vad.py [--utterances 24] [--sessions 1 8 32 128]

1. **Boundaries.** Each utterance (a sentence of the set below, spoken by espeak-ng, US English
   at a speed that varies by utterance) stands between 1.2 s of silence, its speech start and
   end known to the sample; the first half of every other utterance is followed by a 300 ms
   pause inside it. Printed per detector: how many utterances came out as one turn, and the
   start and end errors (median and largest, ms) at OpenAI's defaults (threshold 0.5, 500 ms of
   silence).
2. **Cost.** The CPU time of one 32 ms frame: one session alone, then N sessions' frames in
   one call (as the worker batches a loop turn's frames), per frame and per session; and how
   many sessions one core keeps up with (32 ms of audio a frame). Then Smart Turn's CPU time
   per scored pause (semantic_vad: once per pause of 160 ms or more, in a thread).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.spoken import RATE, SENTENCES, pcm16, spoken
from worker.api.realtime.config import VadConfig
from worker.api.realtime.turns import (
    MODEL_FRAME,
    ServerVad,
    SpeechStarted,
    SpeechStopped,
    silero,
    smart_turn,
)

SILENCE_S = 1.2
INNER_PAUSE_S = 0.3


def utterances(n: int) -> list[tuple[np.ndarray, int, int]]:
    """``n`` utterances with the silence around them: (audio, speech start, speech end)."""
    out = []
    gap = np.zeros(int(SILENCE_S * RATE), np.float32)
    for i in range(n):
        words = SENTENCES[i % len(SENTENCES)].split()
        speed = 150 + 10 * (i % 5)
        if i % 2:  # a pause inside the turn, between its two halves
            half = len(words) // 2
            first, second = (
                spoken(" ".join(words[:half]), speed=speed),
                spoken(" ".join(words[half:]), speed=speed),
            )
            pause = np.zeros(int(INNER_PAUSE_S * RATE), np.float32)
            speech = np.concatenate([first, pause, second])
        else:
            speech = spoken(" ".join(words), speed=speed)
        out.append((np.concatenate([gap, speech, gap]), gap.size, gap.size + speech.size))
    return out


class WebRtcVad:
    """The detector server_vad ran before (webrtcvad on 30 ms frames at 16 kHz, aggressiveness
    from the threshold, a turn after 3 voiced frames in a row, ended by silence_duration_ms of
    unvoiced ones), reproduced here to compare."""

    FRAME = RATE * 30 // 1000
    START_FRAMES = 3

    def __init__(self, config: VadConfig) -> None:
        import webrtcvad

        self.vad = webrtcvad.Vad(min(3, int(config.threshold * 4)))
        self.silence_frames = max(1, -(-config.silence_duration_ms // 30))

    def turns(self, samples: np.ndarray) -> list[SpeechStarted | SpeechStopped]:
        from worker.layers.resample import resample

        found: list[SpeechStarted | SpeechStopped] = []
        voiced_run = unvoiced_run = last_voiced_end = 0
        speaking = False
        for start in range(0, samples.size - self.FRAME + 1, self.FRAME):
            frame = resample(samples[start : start + self.FRAME], RATE, 16_000)
            pcm = (np.clip(frame, -1, 1) * 32767).astype("<i2").tobytes()
            end = start + self.FRAME
            if self.vad.is_speech(pcm, 16_000):
                voiced_run, unvoiced_run, last_voiced_end = voiced_run + 1, 0, end
                if not speaking and voiced_run >= self.START_FRAMES:
                    speaking = True
                    found.append(SpeechStarted(start - (self.START_FRAMES - 1) * self.FRAME))
            else:
                voiced_run, unvoiced_run = 0, unvoiced_run + 1
                if speaking and unvoiced_run >= self.silence_frames:
                    speaking = False
                    found.append(SpeechStopped(last_voiced_end, end))
        return found


async def silero_turns(samples: np.ndarray, config: VadConfig) -> list:
    vad = ServerVad(config)
    pcm = pcm16(samples)
    found = []
    for at in range(0, len(pcm), 960):  # 20 ms appends
        found += await vad.feed(pcm[at : at + 960])
    return found


def boundaries(name: str, results: list[tuple[list, int, int]]) -> dict:
    whole = [r for r in results if [type(t) for t in r[0]] == [SpeechStarted, SpeechStopped]]
    starts = [abs(t[0].at - s) * 1000 / RATE for t, s, _ in whole]
    ends = [abs(t[1].at - e) * 1000 / RATE for t, _, e in whole]
    row = {
        "detector": name,
        "one turn": f"{len(whole)}/{len(results)}",
        "start error ms (median, max)": (round(statistics.median(starts)), round(max(starts)))
        if starts
        else None,
        "end error ms (median, max)": (round(statistics.median(ends)), round(max(ends)))
        if ends
        else None,
        "within 100 ms": sum(a <= 100 and b <= 100 for a, b in zip(starts, ends, strict=True)),
    }
    print(row, flush=True)
    return row


def cost(sessions: list[int], frames: int = 400) -> list[dict]:
    model = silero()
    rng = np.random.default_rng(0)
    rows = []
    for n in sessions:
        streams = [ServerVad(VadConfig()).stream for _ in range(n)]
        x = (0.05 * rng.standard_normal((n, MODEL_FRAME))).astype(np.float32)
        model.step(streams, x)  # (warm)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(frames):
            model.step(streams, x)
        cpu = (time.process_time() - c0) / frames
        row = {
            "sessions in a call": n,
            "CPU ms per call": round(1000 * cpu, 3),
            "CPU ms per session-frame": round(1000 * cpu / n, 4),
            "sessions one core holds": int(0.032 / (cpu / n)),
            "wall ms per call": round(1000 * (time.perf_counter() - t0) / frames, 3),
        }
        print(row, flush=True)
        rows.append(row)
    return rows


def pause_cost(sets: list[tuple[np.ndarray, int, int]]) -> None:
    from worker.layers.resample import resample

    model = smart_turn()
    turns = [resample(a[s:e], RATE, 16_000) for a, s, e in sets[:8]]
    model.complete(turns[0])  # (warm)
    c0 = time.process_time()
    for turn in turns:
        model.complete(turn)
    print({"Smart Turn CPU ms per pause": round(1000 * (time.process_time() - c0) / len(turns), 1)})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--utterances", type=int, default=24)
    p.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32, 128])
    args = p.parse_args()
    config = VadConfig()
    sets = utterances(args.utterances)
    webrtc = WebRtcVad(config)
    boundaries("webrtc", [(webrtc.turns(a), s, e) for a, s, e in sets])
    silero_results = [(asyncio.run(silero_turns(a, config)), s, e) for a, s, e in sets]
    boundaries("silero", silero_results)
    cost(args.sessions)
    pause_cost(sets)


if __name__ == "__main__":
    main()
