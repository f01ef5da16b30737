"""``omni-plan`` as a real subprocess: the table, --json, --svg, explain, and exit statuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "configs" / "models"


SPEECH = str(MODELS / "qwen3-omni-30b-a3b-speech.yaml")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One disk cache for this module: the first run builds on the meta device, later runs
    read what it counted (and never import torch)."""
    return tmp_path_factory.mktemp("omni-plan-cache")


def omni_plan(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(Path(sys.executable).with_name("omni-plan"))]  # this environment's script
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "VIRTUAL_ENV")}
    env = keep | {"COLUMNS": "200", "OMNI_PLAN_CACHE": str(cache), "HOME": str(cache)}
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, timeout=240, cwd=ROOT, env=env
    )


def test_table_and_svg(cache: Path, tmp_path: Path) -> None:
    svg = tmp_path / "gpus.svg"
    out = omni_plan(cache, SPEECH, "--gpus", "2xH100-80GB", "--svg", str(svg))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "qwen3-omni-30b-a3b-speech (2xH100-80GB): fits, 1 replica(s)" in text
    assert "CUDA_VISIBLE_DEVICES" in text and "0/thinker" in text and "0/talker" in text
    assert "talker" in text.splitlines()[next(i for i, line in enumerate(text.splitlines())
                                              if line.startswith("│   1 "))]  # fmt: skip
    assert "65,536" in text  # the thinker's KV tokens: 16 requests x 4096
    root = ET.parse(svg).getroot()
    titles = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith("0/thinker weights: 61,065,293,824 B") for t in titles)
    assert any(t.startswith("0/talker kv_cache:") for t in titles)


def test_json_is_the_launch_plan(cache: Path) -> None:
    out = omni_plan(cache, SPEECH, "--gpus", "2xH100-80GB", "--json",
                    "--thinker.engine.max_running_requests", "8")  # fmt: skip
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["version"] == 2 and plan["fits"] is True
    assert plan["spec"] == "qwen3-omni-30b-a3b-speech"
    (node,) = plan["nodes"]
    procs = {p["name"]: p for p in node["processes"]}
    thinker = procs["0/thinker"]["stages"][0]
    assert thinker["params"] == 31_719_205_488 - 647_927_168 - 538_631_408
    # the spec's KV pool (kv_budget_tokens), whatever the running requests
    assert thinker["kv_tokens"] == 65_536 and thinker["kv_bytes_per_token"] == 98_304
    assert procs["0/talker"]["env"] == {"CUDA_VISIBLE_DEVICES": "1"}


def test_does_not_fit_exits_1_with_the_overflow_and_fixes(cache: Path) -> None:
    out = omni_plan(cache, SPEECH, "--gpus", "4xL40S-48GB")
    assert out.returncode == 1
    assert "does not fit" in out.stdout
    assert "error: node node0 GPU 0 (L40S-48GB)" in out.stdout and "overflow" in out.stdout
    assert "fix: more TP: --thinker.tp_size 2 --thinker.gpus [0,2]" in out.stdout
    fixed = omni_plan(cache, SPEECH, "--gpus", "4xL40S-48GB", "--thinker.tp_size", "2",
                      "--thinker.gpus", "[0,2]")  # fmt: skip
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr


def test_bad_override_exits_2_with_the_suggestion(cache: Path) -> None:
    out = omni_plan(
        cache, str(MODELS / "qwen3-8b.yaml"), "--gpus", "1xH100-80GB", "--lm.tp_size", "2"
    )
    assert out.returncode == 2
    assert "unknown stage 'lm'" in out.stderr and "did you mean 'llm'?" in out.stderr


def test_explain(cache: Path, tmp_path: Path) -> None:
    ov = tmp_path / "ov.yaml"
    ov.write_text("stages:\n  llm:\n    engine: {context_length: 4096}\n")
    out = omni_plan(cache, "explain", str(MODELS / "qwen3-8b.yaml"), "llm.engine.context_length",
                    "--override-file", str(ov))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "stages.llm.engine.context_length = 4096",
        f"  set by   override file {ov}",
        f"  overrode 8192 from spec {MODELS / 'qwen3-8b.yaml'}",
    ]


def test_explain_shows_an_engine_as_the_worker_starts_it(cache: Path) -> None:
    """``omni-plan explain SPEC <stage>.sglang --gpus ...``: the engine's dtype and where it came
    from, its attention backend, its pool and its SGLang arguments; the plan's table has them."""
    spec = "configs/models/tiny-omni.yaml"
    out = omni_plan(cache, "explain", spec, "thinker.sglang", "--gpus", "1xH100-80GB")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "stages.thinker: SGLang engine in process 0/thinker on GPUs [0]" in text
    assert "dtype bf16: auto, resolved for a node with GPUs (1xH100-80GB)" in text
    assert "attention backend fa3" in text and "KV pool 32,768 tokens" in text
    assert "max_total_tokens = 32768" in text and "disable_prefill_cuda_graph = True" in text
    cpu = omni_plan(cache, "explain", spec, "thinker.dtype")
    assert "stages.thinker.dtype = 'fp32'" in cpu.stdout
    assert "auto, resolved for a node without GPUs" in cpu.stdout
    table = omni_plan(cache, spec, "--gpus", "1xH100-80GB").stdout
    assert "SGLang engines of node0" in table and "attention_backend=fa3" in table
