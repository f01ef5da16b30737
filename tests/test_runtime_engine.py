"""Coordinator with real stage processes running tiny-omni (no HTTP).

One engine is started per module and shared; the process-kill test runs last because it
restarts a process group.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio
import yaml

from planner.localplan import cpu_node_plan
from planner.spec import ModelSpec
from worker.contract.pipeline import (
    AUDIO_INPUT_RATE,
    AUDIO_OUTPUT_RATE,
    AudioChunk,
    Finished,
    GenerationRequest,
    RequestInvalid,
    RequestKind,
    StageFailed,
    TextDelta,
)
from worker.contract.sampling import Sampling
from worker.daemon import coordinator_for
from worker.runtime.coordinator import Coordinator, _stage_threads

pytestmark = pytest.mark.asyncio(loop_scope="module")

REPO = Path(__file__).resolve().parents[1]
SPEC_PATH = REPO / "configs" / "models" / "tiny-omni.yaml"
LONG_PROMPT = [{"role": "user", "content": "Tell me a story."}]


def with_audio(clip: np.ndarray) -> list[dict]:
    """LONG_PROMPT with an audio part before its text (float32 at 16 kHz, as chat decodes it)."""
    text = {"type": "text", "text": LONG_PROMPT[0]["content"]}
    return [{"role": "user", "content": [{"type": "audio", "audio": clip}, text]}]


def make_pipeline(cache: Path, groups: dict[str, list[str]] | None = None) -> Coordinator:
    """tiny-omni's pipeline, in ``groups`` of processes."""
    spec = ModelSpec.model_validate(yaml.safe_load(SPEC_PATH.read_text()))
    return coordinator_for(spec, SPEC_PATH, cpu_node_plan(spec, groups=groups), cache)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("omni-cache")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(cache_dir: Path) -> AsyncIterator[Coordinator]:
    eng = make_pipeline(cache_dir)
    eng.trace = {}
    progress: list[str] = []
    await asyncio.wait_for(eng.start(progress.append), timeout=180)
    assert any("ready" in p for p in progress)
    yield eng
    await asyncio.wait_for(eng.stop(), timeout=30)


def chat(rid: str, audio: bool = False, max_tokens: int | None = None) -> GenerationRequest:
    # (the talker greedy: sampled, the tiny talker's random weights may stop at any frame)
    return GenerationRequest(
        rid, RequestKind.CHAT, messages=LONG_PROMPT, output_audio=audio, max_tokens=max_tokens,
        speech_sampling=Sampling(temperature=0.0) if audio else None,
    )  # fmt: skip


async def collect(eng: Coordinator, req: GenerationRequest, timeout: float = 60) -> list:
    async def run() -> list:
        return [ev async for ev in eng.generate(req)]

    return await asyncio.wait_for(run(), timeout)


def text_of(events: list) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def audio_of(events: list) -> bytes:
    return b"".join(e.pcm16 for e in events if isinstance(e, AudioChunk))


def first(trace: list, stage: str, what: str) -> float:
    return next(t for t, s, w in trace if s == stage and w == what)


async def wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def settled_traffic(eng: Coordinator) -> dict[tuple[str, str], tuple[int, int, int]]:
    """Edge counters once every process has reported after the last request (each reports
    every 0.1 s): the same over three reads 0.2 s apart."""
    await wait_until(lambda: idle(eng), 10, "every stage's queue to drain")
    reads: list[dict] = []
    while len(reads) < 3 or any(r != reads[-1] for r in reads[-3:]):
        await asyncio.sleep(0.2)
        reads.append({edge: t.as_tuple() for edge, t in eng.edge_traffic().items()})
    return reads[-1]


def idle(eng: Coordinator) -> bool:
    st = eng.status()
    return eng.in_flight() == 0 and all(s.queue_depth == 0 for s in st.stages.values())


async def test_status_and_speakers(engine: Coordinator) -> None:
    st = engine.status()
    assert st.ready and st.healthy
    assert set(st.stages) == {
        "preprocessing", "image_encoder", "audio_encoder", "thinker", "decode", "talker",
        "code2wav",
    }  # fmt: skip
    # Qwen3-Omni's speakers, read from the talker's config in the checkpoint
    assert engine.speakers() == ["chelsie", "ethan", "aiden"]


async def test_text_streams_deltas_and_skips_talker(engine: Coordinator) -> None:
    events = await collect(engine, chat("text-1"))
    fin = events[-1]
    assert isinstance(fin, Finished) and fin.prompt_tokens > 0
    # the thinker stops at its end-of-turn token, or at the spec's max_new_tokens
    assert (fin.finish_reason == "stop") == (fin.completion_tokens < 128)
    assert fin.completion_tokens > 4 and text_of(events)
    assert not any(isinstance(e, AudioChunk) for e in events)
    trace = engine.trace["text-1"]
    chunks = [t for t, s, w in trace if s == "thinker" and w == "chunk"]
    assert len(chunks) > fin.completion_tokens // 2  # streamed token by token, not at the end
    # text reached the client while the thinker was still generating
    assert first(trace, "decode", "out") < first(trace, "thinker", "end")
    assert not any(s in ("talker", "code2wav") for _, s, _ in trace)


async def test_max_tokens_and_same_request_same_text(engine: Coordinator) -> None:
    a = await collect(engine, chat("short-a", max_tokens=5))
    b = await collect(engine, chat("short-b", max_tokens=5))
    assert a[-1].completion_tokens == 5 and a[-1].finish_reason == "length"
    assert text_of(a) == text_of(b) and text_of(a)


async def test_audio_chunks_stream_while_talker_runs(engine: Coordinator) -> None:
    events = await collect(engine, chat("audio-1", audio=True, max_tokens=60))
    chunks = [e for e in events if isinstance(e, AudioChunk)]
    assert len(chunks) > 3 and text_of(events)
    pcm = np.frombuffer(audio_of(events), dtype="<i2")
    # whole codec frames of 80 ms (less the decoder's fixed tail)
    frames = -(-len(pcm) // (AUDIO_OUTPUT_RATE * 80 // 1000))
    assert frames > 4 and len(pcm) > (frames - 1) * AUDIO_OUTPUT_RATE * 80 // 1000
    assert np.abs(pcm).max() > 1000  # audible, not silence
    trace = engine.trace["audio-1"]
    # talker and code2wav share a process: the coordinator sees the audio, not the codes
    assert not any(s == "talker" and w == "chunk" for _, s, w in trace)
    assert first(trace, "code2wav", "out") < first(trace, "talker", "done")
    # the thinker's tokens reached the talker as they came, not at the end of the reply
    assert first(trace, "talker", "<-chunk") < first(trace, "thinker", "end")


async def test_speech_voices_are_deterministic_and_distinct(engine: Coordinator) -> None:
    def speech(rid: str, voice: str) -> GenerationRequest:
        return GenerationRequest(
            rid, RequestKind.SPEECH, text="Hello there.", voice=voice, output_audio=True,
            speech_sampling=Sampling(temperature=0),  # (greedy: long enough to compare)
        )  # fmt: skip

    ethan = audio_of(await collect(engine, speech("s1", "ethan")))
    assert ethan == audio_of(await collect(engine, speech("s2", "ethan")))
    assert len(ethan) > 4 * 1920 * 2
    assert ethan != audio_of(await collect(engine, speech("s3", "aiden")))
    # Qwen3-Omni speaks only its built-in speakers (cloning is Qwen3-TTS Base's)
    with pytest.raises(RequestInvalid, match="unknown voice"):
        await collect(engine, speech("s6", "nobody"))


async def test_invalid_requests_are_refused_and_engine_serves_on(engine: Coordinator) -> None:
    with pytest.raises(RequestInvalid, match="without audio"):
        await collect(engine, GenerationRequest("bad-1", RequestKind.TRANSCRIPTION))
    with pytest.raises(RequestInvalid, match="without text"):
        await collect(engine, GenerationRequest("bad-2", RequestKind.SPEECH, text="  "))
    assert engine.in_flight() == 0
    assert isinstance((await collect(engine, chat("good", max_tokens=2)))[-1], Finished)


async def test_prompt_over_the_context_is_refused_before_the_encoders(
    engine: Coordinator,
) -> None:
    long = [{"role": "user", "content": "x" * 2100}]  # byte tokens: over the 2048 context
    before = await settled_traffic(engine)
    with pytest.raises(RequestInvalid, match="exceeds the context length 2048"):
        await collect(engine, GenerationRequest("too-long", RequestKind.CHAT, messages=long))
    after = await settled_traffic(engine)
    # refused where the tokens were counted: nothing went on to an encoder or the thinker
    assert ("preprocessing", "invalid") in {(s, w) for _, s, w in engine.trace["too-long"]}
    for target in ("image_encoder", "audio_encoder", "thinker"):
        edge = ("preprocessing", target)
        assert after.get(edge) == before.get(edge)


async def test_transcription_of_generated_audio(engine: Coordinator) -> None:
    speech = GenerationRequest(
        "tts",
        RequestKind.SPEECH,
        text="Testing one two three.",
        voice="chelsie",
        output_audio=True,
        speech_sampling=Sampling(temperature=0.0),
    )  # fmt: skip (greedy: sampled, the tiny talker may stop before its first frame)
    pcm = np.frombuffer(audio_of(await collect(engine, speech)), dtype="<i2")
    wav24 = pcm.astype(np.float32) / 32768.0
    n16 = len(wav24) * AUDIO_INPUT_RATE // AUDIO_OUTPUT_RATE
    wav16 = np.interp(np.linspace(0, len(wav24) - 1, n16), np.arange(len(wav24)), wav24)
    req = GenerationRequest(
        "stt", RequestKind.TRANSCRIPTION, audio=wav16.astype(np.float32), max_tokens=20
    )
    events = await collect(engine, req)
    assert isinstance(events[-1], Finished) and events[-1].completion_tokens > 0
    # the audio became ~1 token per 80 ms inside the prompt
    assert events[-1].prompt_tokens > len(wav16) / AUDIO_INPUT_RATE * 12
    again = await collect(engine, req)
    assert text_of(again) == text_of(events)
    # chat with an audio input part: the audio tokens join the user's turn
    plain = await collect(engine, chat("chat-plain", max_tokens=3))
    spoken = GenerationRequest(
        "chat-audio-in", RequestKind.CHAT, messages=with_audio(wav16.astype(np.float32)),
        max_tokens=3,
    )  # fmt: skip
    heard = await collect(engine, spoken)
    assert heard[-1].prompt_tokens - plain[-1].prompt_tokens > len(wav16) / AUDIO_INPUT_RATE * 12


async def test_new_request_joins_running_batch(engine: Coordinator) -> None:
    """Step batching: B's first token comes before A (already running) finishes."""
    gen_a = engine.generate(chat("join-a"))
    first_a = await asyncio.wait_for(anext(gen_a), 30)
    assert isinstance(first_a, TextDelta)
    events_b = await collect(engine, chat("join-b", max_tokens=3))
    rest_a = await asyncio.wait_for(_drain(gen_a), 60)
    assert isinstance(rest_a[-1], Finished)
    ta, tb = engine.trace["join-a"], engine.trace["join-b"]
    assert first(tb, "thinker", "chunk") < first(ta, "thinker", "end")
    assert first(tb, "decode", "out") < first(ta, "decode", "done")
    alone = await collect(engine, chat("alone", max_tokens=3))
    assert text_of(events_b) == text_of(alone)  # batching changes nothing


async def _drain(gen) -> list:
    return [ev async for ev in gen]


async def test_abort_frees_the_request_everywhere(engine: Coordinator) -> None:
    gen = engine.generate(chat("abort-1", audio=True))
    async for ev in gen:
        if isinstance(ev, AudioChunk):
            break
    assert engine.in_flight() == 1
    await gen.aclose()  # what cancelling the consumer does
    assert engine.in_flight() == 0
    await wait_until(lambda: idle(engine), 10, "every stage's queue to drain")
    leftovers = [n for n in os.listdir("/dev/shm") if n.startswith(engine.shm_prefix + "_")]
    assert leftovers == []


async def test_cancelled_consumer_task_aborts(engine: Coordinator) -> None:
    started = asyncio.Event()

    async def consume() -> None:
        async for _ev in engine.generate(chat("cancel-1", audio=True)):
            started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: idle(engine), 10, "every stage's queue to drain")


def chirp(seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(AUDIO_INPUT_RATE * seconds)) / AUDIO_INPUT_RATE
    return (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t)).astype(np.float32)


async def test_in_process_edges_hand_over_in_place_and_equal_split_processes(
    engine: Coordinator, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every stage but the thinker in one process (payloads handed over in place, tensors
    included: preprocessing, both encoders, decode, the talker and code2wav) and every stage in
    its own (every edge serialised) give what the tiny layout gives, byte for byte; only edges
    between processes are serialised, and nothing of an in-process edge reaches the
    coordinator. (The thinker and the talker each run an SGLang engine: one a process.)"""
    stages = list(engine.spec.stages)
    # one thread per process as in the tiny layout: sums split over threads round differently
    monkeypatch.setenv("OMNI_STAGE_THREADS", "1")
    with pytest.raises(ValueError, match=r"process 'all' holds 2 autoregressive stages"):
        make_pipeline(cache_dir, groups={"all": stages})
    one = make_pipeline(
        cache_dir, groups={"thinker": ["thinker"], "rest": [s for s in stages if s != "thinker"]}
    )
    split = make_pipeline(cache_dir, groups={s: [s] for s in stages})
    one.trace = {}
    await asyncio.wait_for(one.start(lambda _m: None), timeout=180)
    try:
        await asyncio.wait_for(split.start(lambda _m: None), timeout=180)
        requests = (
            chat("layout-text", max_tokens=20),
            GenerationRequest(
                "layout-speech", RequestKind.CHAT, messages=with_audio(chirp()),
                output_audio=True, max_tokens=10, speech_sampling=Sampling(seed=8),
            ),
        )  # fmt: skip
        for req in requests:
            mixed, alone, apart = [await collect(e, req) for e in (engine, one, split)]
            assert text_of(mixed) and text_of(mixed) == text_of(alone) == text_of(apart)
            assert audio_of(mixed) == audio_of(alone) == audio_of(apart)
            # finish reason and token counts (what the prefix cache served differs: the first
            # engine has served these prompts before)
            ends = [dataclasses.replace(e[-1], cached_tokens=0) for e in (mixed, alone, apart)]
            assert ends[0] == ends[1] == ends[2]
        assert audio_of(mixed)
        in_one, in_split = await settled_traffic(one), await settled_traffic(split)
        in_tiny = await settled_traffic(engine)
    finally:
        await asyncio.wait_for(one.stop(), timeout=30)
        await asyncio.wait_for(split.stop(), timeout=30)
    carrying = [  # edges whose payloads hold arrays (tensors when handed over in place)
        ("preprocessing", "audio_encoder"),
        ("audio_encoder", "thinker"),
        ("thinker", "talker"),
        ("talker", "code2wav"),
    ]
    thinker = {("audio_encoder", "thinker"), ("thinker", "talker"),
               ("preprocessing", "thinker"), ("thinker", "decode")}  # fmt: skip
    for edge in [*carrying, ("preprocessing", "thinker"), ("thinker", "decode")]:
        handed, serialised, size = in_one[edge]
        if edge in thinker:  # (the thinker in a process of its own)
            assert handed == 0 and serialised > 0, edge
        else:
            assert handed > 0 and serialised == 0 and size == 0, edge
        handed, serialised, size = in_split[edge]
        assert handed == 0 and serialised > 0, edge
    assert all(in_split[edge][2] > 0 for edge in carrying)
    # the tiny layout: talker and code2wav share a process, the thinker runs alone
    assert in_tiny[("talker", "code2wav")][1:] == (0, 0)
    assert in_tiny[("thinker", "talker")][0] == 0 and in_tiny[("thinker", "talker")][2] > 0


async def test_killed_stage_process_fails_requests_and_recovers(engine: Coordinator) -> None:
    gen = engine.generate(chat("killed", audio=True))
    async for ev in gen:
        if isinstance(ev, AudioChunk):
            break
    os.kill(engine.process_pids()["0/talker"], signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(StageFailed, match="talker"):
        await asyncio.wait_for(_drain(gen), 10)
    assert time.monotonic() - t0 < 5
    st = engine.status()
    assert not st.healthy and not st.ready and "talker" in st.detail
    with pytest.raises(StageFailed):
        await collect(engine, chat("while-down", max_tokens=2))
    await wait_until(lambda: engine.status().ready, 120, "the talker group to restart")
    st = engine.status()
    assert st.healthy and st.detail == ""
    events = await collect(engine, chat("after", audio=True, max_tokens=5))
    assert isinstance(events[-1], Finished) and audio_of(events)
    await wait_until(lambda: idle(engine), 10, "every stage's queue to drain")


async def test_a_stage_that_cannot_load_fails_start_with_its_error(tmp_path: Path) -> None:
    """The checkpoint's own error (from SGLang, which reads it), when the worker starts."""
    error = "Should have a `model_type` key in its config.json"
    model_dir = tmp_path / "broken"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"architectures": ["NoSuchModelForCausalLM"]}')
    spec = ModelSpec.model_validate(
        {
            "name": "broken",
            "model_dir": str(model_dir),
            "capabilities": {"endpoints": ["chat"]},
            "entry": "llm",
            "stages": {
                "llm": {
                    "executor": "autoregressive",
                    "component": {},
                    "device": "cpu",
                    "terminal": True,
                }
            },
        }
    )
    eng = coordinator_for(spec, tmp_path / "spec.yaml", cpu_node_plan(spec), tmp_path / "cache")
    with pytest.raises(RuntimeError, match=re.escape(error)):
        await asyncio.wait_for(eng.start(lambda _m: None), timeout=120)
    st = eng.status()
    assert not st.ready
    for pid in eng.process_pids().values():
        await wait_until(lambda p=pid: not _alive(p), 10, f"stage process {pid} to exit")


def _alive(pid: int | None) -> bool:
    try:
        os.kill(pid, 0)  # type: ignore[arg-type]
    except (ProcessLookupError, TypeError):
        return False
    return True


def test_stage_processes_share_the_cores_but_one() -> None:
    """The worker's own process keeps a core: a stage process alone on 2 cores runs one thread
    (two spun against the HTTP front: 55-65 against 72-75 transcriptions/s)."""
    assert _stage_threads(2, 1) == 1
    assert _stage_threads(2, 3) == 1
    assert _stage_threads(1, 1) == 1
    assert _stage_threads(16, 1) == 15
    assert _stage_threads(16, 4) == 3
