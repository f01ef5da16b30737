"""Pipeline runtime pieces without stage processes: routing, shared-memory transport, the
batching windows, checkpoints."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from planner.spec import ModelSpec
from tests.plain_lm import SAMPLING, build_plain_lm
from worker.contract.options import RequestInput
from worker.models.checkpoint import resolve_checkpoint
from worker.runtime import transport
from worker.runtime.graph import route
from worker.stages.base import BatchQueue, RequestMeta, StageExecutor
from worker.stages.messages import REQUEST_INPUT
from worker.stages.payloads import TokenPiece

REPO = Path(__file__).resolve().parents[1]
SPEC_PATH = REPO / "configs" / "models" / "tiny-omni.yaml"


def tiny_spec() -> ModelSpec:
    return ModelSpec.model_validate(yaml.safe_load(SPEC_PATH.read_text()))


# ---- routing ---------------------------------------------------------------------------------
def test_text_only_route_skips_talker_and_vocoder() -> None:
    rt = route(tiny_spec(), frozenset({"text"}))
    assert rt.active == ("preprocessing", "image_encoder", "audio_encoder", "thinker", "decode")
    assert rt.terminals == {"decode"}
    assert rt.next_targets["audio_encoder"] == ("thinker",)
    assert rt.required["thinker"] == {"preprocessing", "image_encoder", "audio_encoder"}
    assert rt.stream_targets["thinker"] == ("decode",)
    assert rt.required["preprocessing"] == {REQUEST_INPUT}
    assert rt.required["decode"] == frozenset()  # stream-only: starts at once


def test_speech_route_skips_decode_and_talker_waits_for_preprocessing() -> None:
    rt = route(tiny_spec(), frozenset({"audio"}))
    assert "decode" not in rt.active
    assert rt.terminals == {"code2wav"}
    # Qwen3-Omni's talker sees the encoders only through the thinker's hidden states
    assert rt.required["talker"] == {"preprocessing"}
    assert rt.stream_sources["talker"] == ("thinker",)
    assert rt.stream_targets["thinker"] == ("talker",)


def test_fan_in_waits_for_every_input() -> None:
    spec = ModelSpec.model_validate(
        {
            "name": "fan",
            "model_dir": ".",
            "capabilities": {"endpoints": ["chat"]},
            "entry": "pre",
            "stages": {
                "pre": {"executor": "preprocess", "next": ["a", "b"]},
                "a": {"executor": "encoder", "next": ["agg"]},
                "b": {"executor": "encoder", "next": ["agg"], "only_for_output": ["audio"]},
                "agg": {"executor": "aggregate", "wait_for": ["a", "b"], "next": ["out"]},
                "out": {"executor": "decode", "terminal": True},
            },
        }
    )
    assert route(spec, frozenset({"text", "audio"})).required["agg"] == {"a", "b"}
    # an inactive input is not waited for
    assert route(spec, frozenset({"text"})).required["agg"] == {"a"}


def test_stage_limits_follow_the_route_the_plan_and_the_replicas(tmp_path: Path) -> None:
    """Admission's limit per autoregressive stage: the plan's running requests (the spec's
    when the plan gives none) plus the spec's queued ones, summed over the replicas, for the
    stages that the request's outputs visit."""
    from planner.localplan import cpu_node_plan
    from worker.contract.pipeline import RequestKind, outputs_of
    from worker.daemon import coordinator_for

    spec = tiny_spec()
    spec.stages["talker"].engine.max_queued_requests = 3
    plan = cpu_node_plan(spec)
    one = coordinator_for(spec, SPEC_PATH, plan, tmp_path)
    assert one.stage_limits(outputs_of(RequestKind.CHAT)) == {"thinker": 16 + 64}
    assert one.stage_limits(outputs_of(RequestKind.SPEECH)) == {"thinker": 80, "talker": 19}
    # the plan's running requests win; a second replica doubles the room
    thinker = next(p for p in plan.processes if "thinker" in [s.stage for s in p.stages])
    placed = next(s for s in thinker.stages if s.stage == "thinker")
    placed.max_running_requests = 4
    second = [p.model_copy(update={"name": "1/" + p.group, "replica": 1}) for p in plan.processes]
    two = coordinator_for(
        spec, SPEC_PATH, plan.model_copy(update={"processes": [*plan.processes, *second]}), tmp_path
    )
    assert two.stage_limits(outputs_of(RequestKind.CHAT, output_audio=True)) == {
        "thinker": 2 * (4 + 64),
        "talker": 2 * 19,
    }


# ---- transport -------------------------------------------------------------------------------
def test_large_arrays_travel_through_shared_memory_small_ones_inline() -> None:
    big = np.arange(transport.SHM_THRESHOLD, dtype=np.float32)
    small = np.arange(4, dtype=np.int16)
    packed = transport.pack({"big": big, "small": small, "list": [big]}, "omnitest")
    names = transport.refs(packed)
    assert len(names) == 2 and all(n.startswith("omnitest_") for n in names)
    assert isinstance(packed["small"], np.ndarray)
    assert all(os.path.exists(f"/dev/shm/{n}") for n in names)
    out = transport.unpack(packed)  # a receiver copies; the owner unlinks
    np.testing.assert_array_equal(out["big"], big)
    np.testing.assert_array_equal(out["list"][0], big)
    transport.release(names)
    assert not any(os.path.exists(f"/dev/shm/{n}") for n in names)
    transport.release(names)  # already gone: fine


def test_sweep_removes_an_engines_leftover_segments() -> None:
    packed = transport.pack(np.zeros(10_000, dtype=np.float32), "omnisweep")
    assert transport.sweep("omnisweep") == 1
    assert not os.path.exists(f"/dev/shm/{packed.name}")


def test_bfloat16_tensors_travel_as_exact_float32() -> None:
    t = torch.randn(4, 3).to(torch.bfloat16)
    out = transport.pack({"t": t})["t"]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, t.float().numpy())
    assert transport.nbytes({"t": t, "a": [np.zeros(5, np.int64)]}) == 4 * 3 * 2 + 40


# ---- in-process handover ---------------------------------------------------------------------
class _Recorder(StageExecutor):
    """Records what the dispatcher hands it; ``refuse`` makes ``start`` raise."""

    def __init__(self, name: str, refuse: bool = False) -> None:
        self.name, self.refuse = name, refuse
        self.calls: list[tuple] = []

    def start(self, rid: str, meta: RequestMeta, inputs: dict) -> None:
        if self.refuse:
            raise RuntimeError("cannot take it")
        self.calls.append(("start", rid, inputs))

    def feed(self, rid: str, src: str, data) -> None:
        self.calls.append(("feed", rid, src, data))

    def end_stream(self, rid: str, src: str, info: dict) -> None:
        self.calls.append(("end", rid, src, info))

    def abort(self, rid: str) -> None:
        self.calls.append(("abort", rid))

    def next_deadline(self) -> float | None:
        return None

    def step(self) -> list:
        return []

    def queue_depth(self) -> int:
        return 0


def test_stages_of_one_process_hand_payloads_over_in_place() -> None:
    from worker.runtime.dispatch import Dispatcher
    from worker.stages import messages as m

    spec = ModelSpec.model_validate(
        {
            "name": "handover",
            "model_dir": ".",
            "capabilities": {"endpoints": ["chat"]},
            "entry": "pre",
            "stages": {
                "pre": {"executor": "preprocess", "next": ["enc", "llm"]},
                "enc": {"executor": "encoder", "next": ["llm"]},
                "llm": {
                    "executor": "autoregressive",
                    "wait_for": ["pre", "enc"],
                    "stream_to": ["out"],
                },
                "out": {"executor": "decode", "terminal": True},
            },
        }
    )
    here = {"pre": _Recorder("pre"), "enc": _Recorder("enc"), "out": _Recorder("out")}
    d = Dispatcher(spec, dict(here))  # llm runs in another process
    meta = RequestMeta("chat", frozenset({"text"}))
    d.open("r", {"pre": meta, "enc": meta, "out": meta})
    assert here["out"].calls == [("start", "r", {})]  # stream-only: starts at once
    d.receive(m.INPUT, "pre", "r", REQUEST_INPUT, {"text": "hi"})
    assert here["pre"].calls == [("start", "r", {REQUEST_INPUT: {"text": "hi"}})]

    hidden = torch.randn(8, 1024)  # 32 KiB: over the shared-memory threshold
    payload = {"ids": [1, 2], "hidden": hidden}
    d.emit("pre", [(m.FINAL, "r", payload)])
    ((_, _, got),) = here["enc"].calls
    assert got["pre"] is payload and got["pre"]["hidden"] is hidden  # the very tensor
    ((kind, src, rid, packed),) = d.take()  # one serialised copy, for llm in another process
    assert (kind, src, rid) == (m.FINAL, "pre", "r")
    assert isinstance(packed["hidden"], transport.ShmRef)
    np.testing.assert_array_equal(transport.unpack(packed)["hidden"], hidden.numpy())
    transport.release(transport.refs(packed))
    assert d.traffic_report() == {("pre", "enc"): (1, 0, 0), ("pre", "llm"): (0, 1, 32 * 1024)}

    d.receive(m.CHUNK, "out", "r", "llm", {"tokens": [5]})  # from llm, through the coordinator
    d.emit("out", [(m.OUT, "r", ("text", "x")), (m.DONE, "r", {})])
    assert here["out"].calls[-1] == ("feed", "r", "llm", {"tokens": [5]})
    assert [msg[0] for msg in d.take()] == [m.OUT, m.DONE]

    d.close("r")
    assert all(ex.calls[-1] == ("abort", "r") for ex in here.values())
    d.receive(m.INPUT, "pre", "r", REQUEST_INPUT, {})  # late: ignored
    d.emit("pre", [(m.FINAL, "r", payload)])
    assert d.take() == [] and here["pre"].calls[-1] == ("abort", "r")

    # an executor that fails on its input fails the request in that stage only
    refusing = Dispatcher(spec, {"pre": _Recorder("pre", refuse=True)})
    refusing.open("q", {"pre": meta})
    refusing.receive(m.INPUT, "pre", "q", REQUEST_INPUT, {})
    assert refusing.take() == [(m.ERROR, "pre", "q", "pre: cannot take it")]


# ---- batching window -------------------------------------------------------------------------
def test_batch_queue_window_and_max_size() -> None:
    q = BatchQueue(max_batch_size=3, window_ms=50)
    assert q.deadline() is None
    q.put("a", 1)
    first = q.deadline()
    assert first is not None and first > 0
    q.put("b", 2, weight=2)
    assert q.deadline() <= first  # full: run now
    q.put("c", 3)
    assert [rid for rid, _ in q.take()] == ["a", "b"]
    assert [rid for rid, _ in q.take()] == ["c"]


# ---- checkpoint + KV batching ----------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resolve_checkpoint(tiny_spec(), SPEC_PATH, tmp_path_factory.mktemp("cache"), log=print)


def test_seeded_checkpoint_is_an_ordinary_checkpoint(checkpoint: Path) -> None:
    """What a Hugging Face download of Qwen3-Omni holds: one config, sharded safetensors with an
    index in the published tensor layout, tokenizer and processor files."""
    index = json.loads((checkpoint / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 1  # sharded
    assert all((checkpoint / shard).is_file() for shard in set(index.values()))
    assert "thinker.audio_tower.conv2d1.weight" in index  # the published names
    assert "thinker.model.layers.0.mlp.experts.0.gate_proj.weight" in index  # per-expert
    for name in ("config.json", "tokenizer.json", "preprocessor_config.json"):
        assert (checkpoint / name).is_file()
    saved = json.loads((checkpoint / "config.json").read_text())
    assert saved["architectures"] == ["Qwen3OmniMoeForConditionalGeneration"]
    assert set(saved["talker_config"]["speaker_id"]) == {"chelsie", "ethan", "aiden"}


def test_concurrent_builds_agree_on_one_directory(tmp_path: Path) -> None:
    results: list[Path] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(resolve_checkpoint(tiny_spec(), SPEC_PATH, tmp_path))
        )
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 2 and results[0] == results[1]
    assert [p.name for p in tmp_path.iterdir()] == [results[0].name]  # no temp dirs left


def _reference_greedy(model, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@pytest.fixture(scope="module")
def plain_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_plain_lm(tmp_path_factory.mktemp("plain-lm"))


# ---- a real checkpoint directory, stages driven in-process -----------------------------------
@pytest.fixture(scope="module")
def plain_stages(plain_lm: Path, tmp_path_factory) -> dict:
    """The three stages of a plain model's spec (configs/models/qwen3-8b.yaml's, at toy size),
    loaded in this process, the language model on SGLang (closed at the module's end: SGLang
    runs one engine at a time in a process)."""
    from worker.contract.stage_context import StageContext
    from worker.models.registry import make_executor

    spec = ModelSpec.model_validate(
        {
            "name": "plain-lm",
            "model_dir": str(plain_lm),
            "capabilities": {"endpoints": ["chat"]},
            "entry": "preprocessing",
            "stages": {
                "preprocessing": {"executor": "preprocess", "device": "cpu", "next": ["llm"]},
                "llm": {
                    "executor": "autoregressive",
                    "component": {},
                    "device": "cpu",
                    "dtype": "fp32",
                    "stream_to": ["decode"],
                    "engine": {"max_new_tokens": 256},
                },
                "decode": {"executor": "decode", "device": "cpu", "terminal": True},
            },
        }
    )
    tmp = tmp_path_factory.mktemp("plain-spec")
    assert resolve_checkpoint(spec, tmp / "spec.yaml", tmp / "cache") == plain_lm
    stages = {}
    for name in spec.stages:
        ctx = StageContext(name, spec, spec.stages[name], plain_lm, "cpu", 4)
        stages[name] = make_executor(ctx)
        stages[name].load()
    yield stages
    for stage in stages.values():
        stage.close()


def test_plain_checkpoint_text_pipeline_matches_hf_generate(plain_lm: Path, plain_stages) -> None:
    """Greedy text through preprocessing, the language model and decode equals transformers'
    ``generate``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worker.contract.sampling import Sampling
    from worker.stages.base import CHUNK, DONE, END, FINAL, OUT, RequestMeta

    model_dir = plain_lm
    pre, llm, dec = (plain_stages[n] for n in ("preprocessing", "llm", "decode"))
    meta = RequestMeta("chat", frozenset({"text"}), 12, sampling=Sampling(temperature=0))
    prompts = {"r1": "Tell me a story.", "r2": "hi"}
    for rid, text in prompts.items():
        request = RequestInput("chat", [{"role": "user", "content": text}])
        pre.start(rid, meta, {REQUEST_INPUT: request})
        ((kind, _, payload),) = pre.step()
        assert kind == FINAL
        llm.start(rid, meta, {"preprocessing": payload})
        dec.start(rid, meta, {})
    tokens: dict[str, list[int]] = {rid: [] for rid in prompts}
    texts = dict.fromkeys(prompts, "")
    finished: set[str] = set()
    for _ in range(100):
        for kind, rid, data in llm.step():  # both requests share each decode step
            if kind == CHUNK:
                tokens[rid] += data.tokens
                dec.feed(rid, "llm", data)
            elif kind == END:
                dec.end_stream(rid, "llm", data)
        for kind, rid, data in dec.step() if dec.next_deadline() is not None else []:
            if kind == OUT:
                texts[rid] += data[1]
            elif kind == DONE:
                finished.add(rid)
        if finished == set(prompts):
            break
    assert finished == set(prompts)

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for rid, text in prompts.items():
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt",
            return_dict=True,
        )["input_ids"]  # fmt: skip
        ref = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :].tolist()
        ref = [t for t in ref if t not in (258, 256)]  # eos / padding after it
        assert tokens[rid] == ref
        assert texts[rid] == tok.decode(ref, skip_special_tokens=True)


def test_aggregate_gathers_inputs_found_by_type() -> None:
    """An aggregate passes its inputs on together (in its sources' name order, an earlier
    aggregate's flattened); a stage after it finds each by its type, whatever the stage that
    sent it is named, and one that is missing or doubled is an error naming what came."""
    from worker.contract.stage_context import StageContext
    from worker.models.registry import make_executor
    from worker.stages.base import FINAL, RequestMeta, input_of, inputs_of
    from worker.stages.payloads import Gathered, PromptIds, TextPiece

    spec = ModelSpec.model_validate(
        {
            "name": "agg",
            "model_dir": ".",
            "capabilities": {"endpoints": ["chat"]},
            "entry": "merge",
            "stages": {
                "merge": {"executor": "aggregate", "device": "cpu", "next": ["llm"]},
                "llm": {"executor": "autoregressive", "stream_to": ["out"]},
                "out": {"executor": "decode", "terminal": True},
            },
        }
    )
    agg = make_executor(StageContext("merge", spec, spec.stages["merge"], Path("."), "cpu", 1))
    agg.load()
    ids, text, more = PromptIds([1, 2]), TextPiece("a"), TextPiece("b")
    inputs = {"b": Gathered([text]), "c": more, "a": ids}
    agg.start("r", RequestMeta("chat", frozenset({"text"})), inputs)
    assert agg.next_deadline() is not None and agg.queue_depth() == 1
    ((kind, rid, gathered),) = agg.step()
    assert (kind, rid, gathered) == (FINAL, "r", Gathered([ids, text, more]))
    after = {"merge": gathered}
    assert input_of(after, PromptIds) is ids
    assert inputs_of(after, TextPiece) == [text, more]
    with pytest.raises(TypeError, match=r"expected one TextPiece .* got \{'merge': 'Gathered'\}"):
        input_of(after, TextPiece)


def test_decode_streams_multibyte_text_without_broken_characters(checkpoint: Path) -> None:
    from worker.contract.stage_context import StageContext
    from worker.models.registry import make_executor
    from worker.stages.base import DONE, OUT, RequestMeta

    spec = tiny_spec()
    dec = make_executor(StageContext("decode", spec, spec.stages["decode"], checkpoint, "cpu", 1))
    dec.load()
    text = "héllo wörld ✓ 你好"
    dec.start("r", RequestMeta("chat", frozenset({"text"})), {})
    deltas: list[str] = []
    for b in text.encode():  # byte-level ids: one byte per token
        dec.feed("r", "thinker", TokenPiece([b]))
        deltas += [d[1] for kind, _, d in dec.step() if kind == OUT]
    dec.end_stream("r", "thinker", {"finish_reason": "stop"})
    outs = dec.step()
    deltas += [d[1] for kind, _, d in outs if kind == OUT]
    assert "".join(deltas) == text and not any("\ufffd" in d for d in deltas)
    assert len(deltas) > 10 and outs[-1] == (DONE, "r", {"finish_reason": "stop"})
    assert dec.queue_depth() == 0


SHIPPED = sorted(
    p.name
    for p in (Path(__file__).parent.parent / "configs" / "models").glob("*.yaml")
    if not p.name.startswith("tiny-")
)


@pytest.mark.parametrize("spec", SHIPPED)
def test_every_stage_of_a_shipped_spec_runs_where_the_plan_counts_it(spec: str) -> None:
    """On a two-GPU host: a stage declared cpu runs on the CPU even inside a GPU process (the
    1.7 B TTS spec put its preprocessing, Mimi's encoder, on cuda:0 and its warm-up fed it a
    CPU tensor), and the planner counts it as host memory, not on the GPU."""
    from planner.api import plan_spec
    from worker.runtime.host import stage_device

    result = plan_spec(f"configs/models/{spec}", "2xH100-80GB")
    assert result.plan.fits, result.plan.errors
    node = result.plan.nodes[0]
    on_gpus = {key.split("/", 1)[1] for g in node.gpus for key in g.by_stage}
    for process in node.processes:
        device = "cuda:0" if process.device == "gpu" else "cpu"
        for placed in process.stages:
            declared = result.spec.stages[placed.stage].device.value
            runs = stage_device(declared, device)
            assert runs == ("cpu" if declared == "cpu" else device), (process.name, placed.stage)
            assert (placed.stage in on_gpus) == runs.startswith("cuda"), (spec, placed.stage)


async def test_a_stage_ready_before_its_process_object_returns_is_not_lost(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A fast stage's reader thread can deliver READY before the coordinator holds its process
    object: that raised KeyError in the reader thread, which died, and the start hung (seen
    once in four full runs, under load)."""
    import yaml

    from planner.localplan import cpu_node_plan
    from planner.spec import ModelSpec
    from worker.models.voices import CheckpointVoices
    from worker.runtime import coordinator as engine_module
    from worker.stages import messages as m

    class ImmediateProcess:
        """Reports every stage ready from inside its constructor, as a racing reader can."""

        def __init__(self, cfg, on_messages, on_exit) -> None:
            self.cfg, self.name, self.pid = cfg, cfg.process, 1
            self.ready: set[str] = set()
            on_messages([(m.READY, s) for s in cfg.stages])

        @property
        def all_ready(self) -> bool:
            return self.ready == set(self.cfg.stages)

        def send(self, msg: tuple) -> None: ...
        def flush(self) -> None: ...
        def close(self) -> None: ...
        def stop(self) -> None: ...

    spec_path = Path("configs/models/tiny-omni.yaml")
    spec = ModelSpec.model_validate(yaml.safe_load(spec_path.read_text()))
    monkeypatch.setattr(engine_module, "StageProcess", ImmediateProcess)
    engine = engine_module.Coordinator(
        spec,
        cpu_node_plan(spec),
        checkpoint=lambda _log: tmp_path,
        voices=CheckpointVoices([], False),
    )
    await asyncio.wait_for(engine.start(lambda _m: None), timeout=10)
    assert engine.status().ready


def test_the_plain_stage_serves_the_sampling_surface(plain_stages) -> None:
    """The plain stage (the Qwen3-8B spec's) on SGLang: greedy at temperature 0, seeded
    sampling reproducible, the chosen token the likeliest at temperature 0 with its rivals in
    order, ``logit_bias`` forcing a token, a JSON ``response_format`` met by random weights, a
    prompt over the context refused."""
    from worker.contract.grammar import Grammar
    from worker.contract.sampling import Sampling
    from worker.stages.base import CHUNK, DONE, INVALID, RequestMeta
    from worker.stages.payloads import PromptIds

    llm = plain_stages["llm"]

    def run(meta: RequestMeta, ids: tuple[int, ...] = (5, 6, 7, 8)) -> list:
        llm.start("r", meta, {"in": PromptIds(list(ids))})
        outs = []
        while llm.next_deadline() is not None:
            outs += llm.step()
        assert outs and outs[-1][0] in (DONE, INVALID)
        return outs

    def chunks(**fields) -> list[dict]:
        meta = RequestMeta("chat", frozenset({"text"}), **{"max_tokens": 12, **fields})
        return [d for kind, _, d in run(meta) if kind == CHUNK]

    def tokens(sampling: Sampling) -> list[int]:
        return [t for d in chunks(sampling=sampling) for t in d.tokens]

    greedy = tokens(Sampling(temperature=0))
    assert len(greedy) == 12  # (random weights never reach the end token first)
    # what a request leaves unset, the checkpoint's generation config gives (Qwen3's sampling)
    by_default = tokens(Sampling(seed=4))
    assert (
        by_default
        == tokens(Sampling(**{k: v for k, v in SAMPLING.items() if k != "do_sample"}, seed=4))
        and by_default != greedy
    )
    seeded = [tokens(Sampling(temperature=1.5, seed=s)) for s in (1, 1, 2, 3)]
    assert seeded[0] == seeded[1] and len({tuple(t) for t in seeded}) >= 2
    assert any(t != greedy for t in seeded)
    forced = (greedy[0] + 1) % 256
    assert set(tokens(Sampling(temperature=0, logit_bias=((forced, 100.0),)))) == {forced}
    listed = chunks(sampling=Sampling(temperature=0), logprobs=3)
    assert [d.tokens[0] for d in listed] == greedy
    for d in listed:
        ((chosen, top),) = d.logprobs
        assert top[0][0] == d.tokens[0] and top[0][1] == pytest.approx(chosen, abs=1e-4)
        assert len(top) == 3 and [v for _, v in top] == sorted((v for _, v in top), reverse=True)
    text = bytes(t for d in chunks(sampling=Sampling(temperature=1.0, top_k=0, top_p=1.0, seed=3),
                                   grammar=Grammar("json"), max_tokens=200)
                 for t in d.tokens)  # fmt: skip
    json.loads(text)  # valid JSON, as response_format json_object promises
    outs = run(RequestMeta("chat", frozenset({"text"})), ids=tuple(range(4096)))
    assert [(kind, rid) for kind, rid, _ in outs] == [(INVALID, "r")]
    assert "exceeds the context length" in outs[0][2]
