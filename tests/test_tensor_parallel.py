"""Tensor parallelism through SGLang on a CPU: an autoregressive stage with ``tp_size: 2`` is
planned as one process of two ranks, and its engine (rank 0 in this process, rank 1 a process
it starts: ``worker.engines.sglang.engine.Ranks``, gloo between them) gives the greedy tokens
of ``tp_size: 1`` (fp32) for a dense Qwen3, over prefills of several prompts, chunked prefill
beside decodes, and an abort mid-reply; and through a real worker and router, the tiny-omni
thinker's MoE (its experts' intermediate width split between the ranks, the family's own model
class on each) answers on two ranks as on one."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import openai
import pytest

from planner.spec import DType
from tests.fakes.procs import Router, wait_for
from tests.plain_lm import build_plain_lm
from tests.reliability.fleet import Fleet
from tests.test_openai_sdk import wav_bytes
from tests.worker_procs import WorkerProcess
from worker.engines.base import EngineRequest

REPO = Path(__file__).resolve().parents[1]


def test_a_cpu_stage_of_two_ranks_is_planned_as_one_process_of_two() -> None:
    import io

    from rich.console import Console

    from planner.api import plan_spec
    from planner.errors import SpecError
    from planner.render import print_plan

    planned = plan_spec(REPO / "configs/models/tiny-omni.yaml", "cpu", ["--thinker.tp_size", "2"])
    (thinker,) = [p for p in planned.plan.nodes[0].processes if p.group == "thinker"]
    assert thinker.tp_size == 2 and thinker.device == "cpu"
    out = io.StringIO()
    print_plan(planned.plan, Console(file=out, width=200), "tiny-omni")
    assert "(tp2)" in out.getvalue()
    with pytest.raises(SpecError, match=r"tp_size 2 on a cpu encoder stage"):
        plan_spec(REPO / "configs/models/tiny-omni.yaml", "cpu", ["--audio_encoder.tp_size", "2"])


def _tokens(model_path: Path, tp: int) -> tuple[dict[str, list[int]], int]:
    """Each request's tokens, and the rows of layer 0's qkv projection on rank 0."""
    from worker.engines.sglang.engine import EngineSettings, SGLangEngine

    settings = EngineSettings(model_path=model_path, device="cpu", dtype=DType.FP32,
                              context_length=2048, max_running_requests=8, kv_tokens=0,
                              prefill_chunk_tokens=32, tp_size=tp)  # fmt: skip
    engine = SGLangEngine(settings)
    out: dict[str, list[int]] = {}
    model = engine.model
    rows = getattr(model, "thinker", model).model.layers[0].self_attn.qkv_proj.weight.shape[0]
    assert len(engine.ranks.procs if engine.ranks else []) == tp - 1
    try:

        def request(rid: str, ids: list[int], new: int) -> EngineRequest:
            return EngineRequest(rid, ids, new, stop_token_ids=frozenset())

        for i in range(3):
            engine.submit(request(f"p{i}", [20 + (7 * i + k) % 200 for k in range(5 + 9 * i)], 8))
        engine.submit(request("gone", [33, 34, 35], 40))
        steps = 0
        while engine.has_work():
            for ev in engine.step():
                out.setdefault(ev.rid, []).extend(ev.tokens)
            steps += 1
            if steps == 3:
                engine.abort("gone")
                engine.submit(request("long", [60 + k % 150 for k in range(100)], 6))
    finally:
        engine.close()
    return out, rows


def test_two_ranks_give_the_tokens_of_one(tmp_path: Path) -> None:
    """A dense Qwen3 on SGLang's own class (the thinker's MoE on two ranks is served through a
    worker below)."""
    checkpoint = build_plain_lm(tmp_path / "plain")
    (one, rows_one), (two, rows_two) = _tokens(checkpoint, 1), _tokens(checkpoint, 2)
    assert rows_two * 2 == rows_one  # (each rank holds half the heads)
    assert set(one) == {"p0", "p1", "p2", "gone", "long"}
    assert len(one["long"]) == 6 and len(one["gone"]) < 40
    assert two == one


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_thinker_on_two_ranks_answers_as_on_one_through_a_router(omni_fleet: Fleet) -> None:
    """A tiny-omni worker whose thinker runs ``tp_size: 2`` (rank 1 a process of its own, its
    model class registered there as on rank 0) behind a router of its own, driven with the SDK:
    greedy chats (a short prompt, one long enough to prefill in chunks, one with an audio clip,
    and one streamed) equal those of the shared fleet's one-rank workers; the worker's log and
    its /v1/models say the thinker runs two ranks."""
    env = {"OMNI_REDIS_URL": omni_fleet.redis_url, "OMNI_WORKER_TOKEN": omni_fleet.worker_token}
    worker = WorkerProcess("--spec", "configs/models/tiny-omni.yaml", "--gpus", "cpu",
                           "--fleet", "tp2", "--thinker.tp_size", "2", worker_id="tp2",
                           env=env, token=omni_fleet.worker_token)  # fmt: skip
    router: Router | None = None
    try:
        router = Router("--fleet", "tp2", name="tp2-router", env=omni_fleet.router_env())
        worker.wait_ready(timeout=300)
        wait_for(lambda: router.ready()["routable_workers"] == 1, timeout=30)
        one, two = (
            openai.OpenAI(base_url=url + "/v1", api_key=omni_fleet.api_key, max_retries=0)
            for url in (omni_fleet.routers[0].url, router.url)
        )
        clip = base64.b64encode(wav_bytes(1.5, freq=260.0)).decode()
        heard = [{"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}},
                 {"type": "text", "text": "What do you hear?"}]  # fmt: skip
        asks = [
            [{"role": "user", "content": "Tell me about rivers."}],
            [{"role": "user", "content": "A long question about weather and maps. " * 40}],
            [{"role": "user", "content": heard}],
        ]
        for ask in asks:
            replies = [
                sdk.chat.completions.create(
                    model="tiny-omni", messages=ask, max_tokens=24, temperature=0
                )
                for sdk in (one, two)
            ]
            texts = [r.choices[0].message.content for r in replies]
            assert texts[0] and texts[0] == texts[1]
            counts = [
                (r.usage.prompt_tokens, r.usage.completion_tokens) for r in replies if r.usage
            ]
            assert len(counts) == 2 and counts[0] == counts[1]
        streamed = two.chat.completions.create(
            model="tiny-omni", messages=asks[0], max_tokens=24, temperature=0, stream=True
        )
        whole = one.chat.completions.create(
            model="tiny-omni", messages=asks[0], max_tokens=24, temperature=0
        )
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert text == whole.choices[0].message.content
        models = httpx.get(worker.url + "/v1/models", headers=worker.headers, timeout=10).json()
        engines = {e["stage"]: e for e in models["data"][0]["engines"]}
        assert engines["thinker"]["tensor_parallel_ranks"] == 2
        assert engines["talker"]["tensor_parallel_ranks"] == 1
        assert "0/thinker: thinker runs on SGLang: fp32 on cpu, torch_native attention, " \
               "2 tensor-parallel ranks" in worker.log(2000)  # fmt: skip
    finally:
        if router is not None:
            router.stop()
        worker.stop()
