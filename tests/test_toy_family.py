"""A model family added from outside the repository, the way docs/omni-worker.md's "Adding a
model family" says: its folder (a copy of tests/toy_family/toy_echo in a temporary folder on
the worker's Python path), one registry line (``--model-family toy_echo``) and a spec. It is
served by a real worker behind a real router, driven with the ``openai`` SDK; a family the
worker cannot use stops it at start with the reason."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from fleet.redis_server import RedisServer
from tests.fakes.procs import Router, wait_for
from tests.worker_procs import WorkerProcess

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TOY = REPO / "tests" / "toy_family" / "toy_echo"

SPEC = """\
name: toy-echo
description: the toy family of docs/omni-worker.md (words back, last first)
model_dir: model
capabilities:
  endpoints: [chat]
entry: echo
stages:
  echo:  # weightless: a CPU stage that writes text (a stage with weights names its component)
    executor: decode
    device: cpu
    dtype: fp32
    terminal: true
    engine: {max_new_tokens: 16}
"""


@pytest.fixture(scope="module")
def family_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The family's folder, its spec and its (weightless) model folder, outside the repo."""
    root = tmp_path_factory.mktemp("toy-family")
    shutil.copytree(TOY, root / "toy_echo")
    (root / "toy-echo.yaml").write_text(SPEC)
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text(json.dumps({"model_type": "toy_echo"}))
    return root


def _env(family_dir: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(family_dir), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path}


@pytest.fixture(scope="module")
def sdk(family_dir: Path) -> Iterator[openai.OpenAI]:
    with RedisServer() as redis:
        worker = WorkerProcess(
            "--spec", str(family_dir / "toy-echo.yaml"), "--model-family", "toy_echo",
            "--gpus", "cpu", "--fleet", "toy", redis_url=redis.url, env=_env(family_dir),
        )  # fmt: skip
        router = Router("--fleet", "toy", "--redis-url", redis.url)
        try:
            worker.wait_ready(timeout=120)
            wait_for(lambda: router.ready()["routable_workers"] == 1, timeout=30)
            yield openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
        finally:
            router.stop()
            worker.stop()


def test_a_family_from_outside_the_repository_serves_through_the_router(
    sdk: openai.OpenAI,
) -> None:
    assert [m.id for m in sdk.models.list().data] == ["toy-echo"]
    ask = [{"role": "user", "content": "one two three"}]
    reply = sdk.chat.completions.create(model="toy-echo", messages=ask)
    assert reply.choices[0].message.content == "three two one"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (3, 3)
    stream = sdk.chat.completions.create(model="toy-echo", messages=ask, stream=True)
    pieces = [c.choices[0].delta.content for c in stream if c.choices]
    pieces = [p for p in pieces if p]
    assert pieces == ["three", " two", " one"]
    cut = sdk.chat.completions.create(model="toy-echo", messages=ask, max_tokens=2)
    assert cut.choices[0].message.content == "three two"
    assert cut.choices[0].finish_reason == "length"


def test_a_family_the_worker_cannot_use_stops_it_at_start(family_dir: Path) -> None:
    clash = family_dir / "second_tts"
    clash.mkdir(exist_ok=True)
    (clash / "__init__.py").write_text(
        "from toy_echo import make_executor\n"
        "from worker.models.family import Family\n"
        "FAMILY = Family('Second TTS', 'qwen3_tts', make_executor)\n"
    )
    cases = {
        "no_such_family": "model family 'no_such_family' cannot be imported",
        "json": "model family 'json' exports no FAMILY",
        "second_tts": "model_type 'qwen3_tts' is already served by Qwen3-TTS",
    }
    for package, reason in cases.items():
        run = subprocess.run(
            [sys.executable, "-m", "worker.cli", "--spec", str(family_dir / "toy-echo.yaml"),
             "--gpus", "cpu", "--model-family", package],
            cwd=REPO, env={**os.environ, **_env(family_dir)}, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert run.returncode != 0 and reason in run.stderr, run.stderr[-2000:]
