"""``--model-dir``: every shipped Qwen3-Omni spec plans and serves a checkpoint directory of the
real layout (here a tiny one) with every stage on the CPU; a repo id resolves through the local
Hugging Face cache and never downloads unless allowed."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from planner.api import plan_spec
from planner.errors import SpecError
from planner.model_dir import resolve_model_dir
from planner.spec import ModelSpec
from tests.worker_procs import WorkerProcess
from worker.models.checkpoint import resolve_checkpoint

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "models" / "tiny-omni.yaml"
SHIPPED = [
    "qwen3-omni-30b-a3b-speech.yaml",
    "qwen3-omni-30b-a3b-speech-colocated.yaml",
    "qwen3-omni-30b-a3b-text.yaml",
]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = ModelSpec.model_validate(yaml.safe_load(TINY.read_text()))
    return resolve_checkpoint(spec, TINY, tmp_path_factory.mktemp("cache"), log=lambda _m: None)


@pytest.mark.parametrize("spec", SHIPPED)
def test_shipped_specs_plan_a_tiny_checkpoint_on_cpu(spec: str, tiny_checkpoint: Path) -> None:
    result = plan_spec(REPO / "configs" / "models" / spec, "cpu", model_dir=tiny_checkpoint)
    assert result.plan.fits, [e.message for e in result.plan.errors]
    assert result.spec.model_dir == str(tiny_checkpoint)
    assert all(s.device.value == "cpu" and s.gpus is None for s in result.spec.stages.values())
    # the weights are the tiny checkpoint's, counted from its config
    thinker = next(
        sp
        for n in result.plan.nodes
        for p in n.processes
        for sp in p.stages
        if sp.stage == "thinker"
    )
    assert 0 < thinker.params < 10_000_000


def test_repo_ids_resolve_offline_from_the_cache_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SpecError, match="not in the local Hugging Face cache"):
        resolve_model_dir("Qwen/Qwen3-Omni-30B-A3B-Instruct")
    with pytest.raises(SpecError, match="no such directory"):
        resolve_model_dir(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError, match=r"no config\.json"):
        resolve_model_dir(str(tmp_path / "empty"))


@pytest.mark.slow
def test_the_30b_speech_spec_serves_a_tiny_checkpoint_on_cpu(tiny_checkpoint: Path) -> None:
    spec = REPO / "configs" / "models" / "qwen3-omni-30b-a3b-speech.yaml"
    # a talker context far below the thinker's: a long prompt fits the thinker, not the talker
    worker = WorkerProcess(
        "--spec", str(spec), "--model-dir", str(tiny_checkpoint), "--gpus", "cpu",
        "--talker.engine.context_length", "64", "--talker.engine.max_new_tokens", "32",
    )  # fmt: skip
    try:
        worker.wait_ready(timeout=300)
        assert "thinker:fp32" in worker.log(400) and "talker:fp32" in worker.log(400)
        body = {
            "model": "qwen3-omni-30b-a3b",
            "messages": [{"role": "user", "content": "Hello?"}],
            "max_tokens": 8,
            "modalities": ["text", "audio"],
            "audio": {"voice": "chelsie", "format": "wav"},
            "seed": 0,  # the talker samples; a tiny random one may end at its first frame
        }
        r = httpx.post(worker.url + "/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        assert message["content"] and len(message["audio"]["data"]) > 1000
        # the talker's prompt carries the user turn: over its own context, a clear 400
        long = {**body, "messages": [{"role": "user", "content": "Hello there, " * 40}]}
        r = httpx.post(worker.url + "/v1/chat/completions", json=long, timeout=300)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "context_length_exceeded" and "talker" in error["message"]
    finally:
        worker.proc.terminate()
        worker.wait_exit(60)
