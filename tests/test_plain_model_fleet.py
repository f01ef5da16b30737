"""A plain language model behind a real omni-router, driven with the ``openai`` SDK: the shipped
Qwen3-8B spec (configs/models/qwen3-8b.yaml: its language model on SGLang, SGLang's own
``Qwen3ForCausalLM``) served on a tiny checkpoint of the same architecture (``--model-dir``).
Before, this stage was the project's greedy loop, which refused logprobs and response_format."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from fleet.redis_server import RedisServer
from tests.fakes.procs import Router, wait_for
from tests.plain_lm import build_plain_lm
from tests.worker_procs import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MODEL = "qwen3-8b"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_plain_lm(tmp_path_factory.mktemp("qwen3-tiny"))


@pytest.fixture(scope="module")
def sdk(checkpoint: Path) -> Iterator[openai.OpenAI]:
    with RedisServer() as redis:
        worker = WorkerProcess(
            "--spec", "configs/models/qwen3-8b.yaml", "--model-dir", str(checkpoint),
            "--gpus", "cpu", "--fleet", "plain", "--llm.engine.max_running_requests", "4",
            redis_url=redis.url,
        )  # fmt: skip
        router = Router("--fleet", "plain", "--redis-url", redis.url)
        try:
            worker.wait_ready(timeout=300)
            assert "llm:fp32" in worker.log(400)
            wait_for(lambda: router.ready()["routable_workers"] == 1, timeout=30)
            yield openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
        finally:
            router.stop()
            worker.stop()


def test_the_sampling_surface_of_a_plain_model(sdk: openai.OpenAI, checkpoint: Path) -> None:
    ask = [{"role": "user", "content": "Say something."}]
    greedy = sdk.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    choice = greedy.choices[0]
    text = choice.message.content or ""
    assert text == _transformers_generate(checkpoint, ask, 8)
    assert greedy.usage is not None and greedy.usage.completion_tokens == 8
    assert choice.finish_reason == "length"
    entries = choice.logprobs.content if choice.logprobs else []
    assert len(entries) == 8
    for e in entries:  # greedy: the chosen token is the likeliest
        assert e.top_logprobs[0].token == e.token
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-4)
    streamed = sdk.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text
    # logit_bias, stop
    forced = sdk.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=4, temperature=0, logit_bias={"65": 100}
    )
    assert forced.choices[0].message.content == "AAAA"
    assert forced.choices[0].finish_reason == "length"
    cut = sdk.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=4, temperature=0, logit_bias={"65": 100},
        stop=["AAA"],
    )  # fmt: skip
    assert cut.choices[0].message.content == "" and cut.choices[0].finish_reason == "stop"
    # seeded sampling: one seed, one text; n choices, each its own
    seeded = [
        sdk.chat.completions.create(
            model=MODEL, messages=ask, max_tokens=8, temperature=1.0, seed=s
        )
        .choices[0]
        .message.content
        for s in (5, 5, 6)
    ]
    assert seeded[0] == seeded[1] and len(set(seeded)) == 2
    # what a request leaves unset, the checkpoint's generation config gives (Qwen3's sampling)
    by_default = sdk.chat.completions.create(model=MODEL, messages=ask, max_tokens=8, seed=7)
    explicit = sdk.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=8, seed=7, temperature=0.6, top_p=0.95,
        extra_body={"top_k": 20},
    )  # fmt: skip
    assert by_default.choices[0].message.content == explicit.choices[0].message.content
    assert by_default.choices[0].message.content != text
    several = sdk.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=8, temperature=1.0, seed=5, n=2
    )
    assert [c.index for c in several.choices] == [0, 1]
    # a strict json_schema with enums, met by random weights (constrained decoding)
    schema = {
        "type": "object",
        "properties": {"mood": {"enum": ["calm", "loud"]}, "yes": {"type": "boolean"}},
        "required": ["mood", "yes"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "m", "schema": schema, "strict": True}}
    out = sdk.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=48, response_format=fmt,  # type: ignore[arg-type]
    )  # fmt: skip
    doc = json.loads(out.choices[0].message.content or "")
    assert doc["mood"] in ("calm", "loud") and isinstance(doc["yes"], bool) and len(doc) == 2


def test_a_plain_model_reuses_a_cached_prefix(sdk: openai.OpenAI) -> None:
    system = {"role": "system", "content": "You answer briefly and exactly. " * 8}
    kw = dict(model=MODEL, max_tokens=4, temperature=0)
    first = sdk.chat.completions.create(  # type: ignore[call-overload]
        messages=[system, {"role": "user", "content": "One?"}], **kw
    )
    second = sdk.chat.completions.create(  # type: ignore[call-overload]
        messages=[system, {"role": "user", "content": "Two?"}], **kw
    )
    assert first.usage is not None and second.usage is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert len(system["content"]) <= cached < second.usage.prompt_tokens, second.usage
    completion = sdk.completions.create(model=MODEL, prompt="Once upon", max_tokens=5,
                                        temperature=0)  # fmt: skip
    assert completion.usage is not None and completion.usage.completion_tokens == 5


def _transformers_generate(checkpoint: Path, messages: list[dict], new_tokens: int) -> str:
    """The greedy reply of transformers' ``generate`` on the same checkpoint and chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    ids = tok.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
