"""Streamed speech is the reference's decode at any length: the vocoder stages of Qwen3-Omni
(code2wav) and Qwen3-TTS (the speech tokenizer's decoder), fed a long stream of codes a few
frames at a time, give byte for byte what the reference decodes from the whole utterance
(``Qwen3OmniMoeCode2Wav.chunked_decode`` and the package's ``SpeechDecoder.chunked``: 300-frame
blocks, 25 frames before each). Before, small chunks with 25 frames of context drifted from the
reference after the first few seconds (the decoders' attention sees hundreds of frames back).

The executors run in this process on the embedded tiny checkpoints (the stage code of the
shipped specs) with 100-frame blocks (``block_frames``), so that a reply crosses two; each
layer keeps its state between steps (``worker.layers.streamed_vocoder``), so a frame is decoded once
(plus each block's 25 context frames). Equal means to float rounding: sums over other lengths
round a sample by one int16 step now and then."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from planner.spec import ModelSpec
from worker.contract.stage_context import StageContext
from worker.layers import streamed_vocoder
from worker.layers.streamed_vocoder import Schedule
from worker.models.checkpoint import resolve_checkpoint
from worker.models.registry import make_executor
from worker.stages.base import DONE, OUT, RequestMeta
from worker.stages.payloads import CodeFrames
from worker.stages.vocoder import Stream

REPO = Path(__file__).resolve().parents[2]
BLOCK = 100
FRAMES = 250  # blocks of 100, 100, 50: windows of 125 frames, past the 72-frame attention window
TOLERANCE = 2  # int16 steps, as the reference tests allow


def executor(spec_name: str, stage: str, cache: Path):
    path = REPO / "configs" / "models" / f"{spec_name}.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["stages"][stage].setdefault("streaming", {}).update(
        block_frames=BLOCK, left_context_frames=25
    )
    spec = ModelSpec.model_validate(raw)
    checkpoint = resolve_checkpoint(spec, path, cache, log=lambda _m: None)
    ex = make_executor(StageContext(stage, spec, spec.stages[stage], checkpoint, "cpu", 4))
    ex.load()
    ex.warmup()
    return ex


def stream(ex, codes: np.ndarray, context: np.ndarray | None = None, seed: int = 0) -> bytes:
    """Feed ``codes`` (frames, groups) in pieces of 1-7 frames, stepping as a stage does."""
    meta = RequestMeta("speech", frozenset({"audio"}))
    ex.start("r", meta, {})
    if context is not None:
        ex.feed("r", "talker", CodeFrames(context, context=True))
    rng = np.random.default_rng(seed)
    pcm: list[bytes] = []
    done = False

    def run() -> None:
        nonlocal done
        for kind, _rid, data in ex.step():
            if kind == OUT:
                pcm.append(data[1].tobytes())
            elif kind == DONE:
                done = True

    at = 0
    while at < len(codes):
        n = int(rng.integers(1, 8))
        ex.feed("r", "talker", CodeFrames(codes[at : at + n]))
        at += n
        run()
    ex.end_stream("r", "talker", {})
    while not done:
        run()
    return b"".join(pcm)


def assert_equal_audio(streamed: bytes, wav) -> None:
    x = np.asarray(wav, np.float32).reshape(-1)
    reference = np.clip(np.round(x * 32767.0), -32768, 32767).astype(np.int32)
    got = np.frombuffer(streamed, "<i2").astype(np.int32)
    assert got.shape == reference.shape
    assert np.abs(reference).max() > 100  # real audio, not silence
    assert np.abs(got - reference).max() <= TOLERANCE


def random_codes(frames: int, groups: int, size: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, size, (frames, groups)).astype(np.int64)


def test_steps_ramp_and_stop_at_block_ends() -> None:
    schedule = Schedule(block=300, context=25, first=1, chunk=8, upsample=10)
    s = Stream(frames=[np.zeros(2)] * 700, ended=True)
    ends = []
    while n := s.ready(schedule):
        s.done += n
        s.step = min(2 * (s.step or schedule.first), schedule.chunk)
        ends.append(s.done)
    assert ends[:5] == [1, 3, 7, 15, 23] and 300 in ends and 600 in ends and ends[-1] == 700
    assert all(b - a <= 8 for a, b in itertools.pairwise(ends))
    # an open stream waits for a whole step
    s = Stream(frames=[np.zeros(2)] * 5)
    s.done, s.step = 3, 4
    assert s.ready(schedule) == 0
    s.frames.append(np.zeros(2))
    s.frames.append(np.zeros(2))
    assert s.ready(schedule) == 4


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vocoder-cache")


def test_omni_code2wav_streams_transformers_chunked_decode(cache: Path) -> None:
    import torch

    ex = executor("tiny-omni", "code2wav", cache)
    cfg = ex.model.config
    codes = random_codes(FRAMES, cfg.num_quantizers, cfg.codebook_size)
    with torch.inference_mode():
        reference = ex.model.chunked_decode(torch.from_numpy(codes.T[None]), BLOCK, 25)
        short = codes[: BLOCK - 5]  # within the first block: the one-pass decode
        one_pass = ex.model(torch.from_numpy(short.T[None]))
    assert_equal_audio(stream(ex, codes), reference)
    assert_equal_audio(stream(ex, short, seed=3), one_pass)


@pytest.mark.parametrize("spec", ["tiny-qwen3-tts", "tiny-qwen3-tts-base"])
def test_tts_vocoder_streams_the_packages_decode(spec: str, cache: Path) -> None:
    import torch

    ex = executor(spec, "vocoder", cache)
    dec = ex.model
    size = dec.cfg["codebook_size"]
    codes = random_codes(FRAMES, dec.num_quantizers, size)
    with torch.inference_mode():
        reference = dec.chunked(torch.from_numpy(codes.T[None]), BLOCK, 25)
    assert_equal_audio(stream(ex, codes), reference)
    # a cloned voice: its reference codes are decoded first, in one sequence, and cut off
    ref = random_codes(30, dec.num_quantizers, size, seed=2)
    with torch.inference_mode():
        joined = dec.chunked(torch.from_numpy(np.concatenate([ref, codes]).T[None]), BLOCK, 25)
    assert_equal_audio(
        stream(ex, codes, context=ref, seed=5), joined[..., 30 * dec.total_upsample :]
    )


def test_streams_decoded_together_equal_each_alone(cache: Path) -> None:
    """Streams at the same point decode as one batch (``batching.max_batch_size``): each is
    still the reference's decode of its own codes."""
    import torch

    ex = executor("tiny-qwen3-tts", "vocoder", cache)
    ex.ctx.stage.batching.max_batch_size = 3
    dec = ex.model
    size = dec.cfg["codebook_size"]
    codes = [random_codes(130, dec.num_quantizers, size, seed=10 + i) for i in range(3)]
    meta = RequestMeta("speech", frozenset({"audio"}))
    pcm: dict[str, list[bytes]] = {f"r{i}": [] for i in range(3)}
    done: set[str] = set()
    sizes: list[int] = []
    decode = ex.decoder.decode
    ex.decoder.decode = lambda work: sizes.append(len(work)) or decode(work)
    for i in range(3):
        ex.start(f"r{i}", meta, {})
    for at in range(0, 130, 5):  # every stream gets 5 frames, then the stage steps
        for i in range(3):
            ex.feed(f"r{i}", "talker", CodeFrames(codes[i][at : at + 5]))
        for kind, rid, data in ex.step():
            if kind == OUT:
                pcm[rid].append(data[1].tobytes())
    for i in range(3):
        ex.end_stream(f"r{i}", "talker", {})
    while len(done) < 3:
        for kind, rid, data in ex.step():
            if kind == OUT:
                pcm[rid].append(data[1].tobytes())
            elif kind == DONE:
                done.add(rid)
    assert sizes.count(3) > 10  # (the blocks' first steps and context decodes run alone)
    for i in range(3):
        with torch.inference_mode():
            reference = dec.chunked(torch.from_numpy(codes[i].T[None]), BLOCK, 25)
        assert_equal_audio(b"".join(pcm[f"r{i}"]), reference)


def whole(ex, codes: np.ndarray) -> bytes:
    """Every frame at once, then the stream's end (a whole reply's codes already there)."""
    meta = RequestMeta("speech", frozenset({"audio"}))
    ex.start("r", meta, {})
    ex.feed("r", "talker", CodeFrames(codes))
    ex.end_stream("r", "talker", {})
    pcm: list[bytes] = []
    while True:
        for kind, _rid, data in ex.step():
            if kind == OUT:
                pcm.append(data[1].tobytes())
            elif kind == DONE:
                return b"".join(pcm)


@pytest.mark.parametrize(
    ("spec", "stage"), [("tiny-omni", "code2wav"), ("tiny-qwen3-tts", "vocoder")]
)
def test_each_layer_decodes_each_frame_once(
    spec: str, stage: str, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the linear cost rests on, counted: the frame-rate part takes each frame once (plus
    each block's 25 context frames, as the reference), and every convolution takes each of its
    input samples once, whether the frames come a few at a time or all at once. A return to
    re-decoding what was decoded (a window of past frames per step) fails here though its
    audio would still equal the reference."""
    ex = executor(spec, stage, cache)
    seen: dict[int, int] = {}  # layer -> input samples it took (new ones: its state aside)

    for op in (streamed_vocoder._CausalConv, streamed_vocoder._TransConv):
        call = op.__call__

        def counted(self, x, state, slot, call=call):
            seen[id(self)] = seen.get(id(self), 0) + x.shape[-1]
            return call(self, x, state, slot)

        monkeypatch.setattr(op, "__call__", counted)
    front = ex.decoder.front
    frames_in = [0]

    class CountedFront:
        def fresh(self):
            return front.fresh()

        def __call__(self, codes, state):
            frames_in[0] += codes.shape[-1]
            return front(codes, state)

    ex.decoder.front = CountedFront()
    model = ex.model
    if stage == "vocoder":  # Qwen3-TTS's speech-tokenizer decoder
        n_q, size = model.num_quantizers, model.cfg["codebook_size"]
    else:  # transformers' code2wav
        n_q, size = model.config.num_quantizers, model.config.codebook_size
    # per layer, samples per frame: one block's frames decoded in one step from a fresh start
    one = random_codes(BLOCK, n_q, size, seed=7)
    whole(ex, one)
    per_frame = {layer: n / BLOCK for layer, n in seen.items()}
    assert frames_in[0] == BLOCK and len(per_frame) > 10
    codes = random_codes(FRAMES, n_q, size)
    decoded = FRAMES + 25 * (math.ceil(FRAMES / BLOCK) - 1)  # each block's context again
    for run in (lambda: stream(ex, codes), lambda: whole(ex, codes)):
        seen.clear()
        frames_in[0] = 0
        run()
        assert frames_in[0] == decoded
        assert seen == {layer: decoded * r for layer, r in per_frame.items()}
