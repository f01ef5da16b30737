"""Acceptance tests of OpenAI compatibility: the official ``openai`` SDK against the router of
the live fleet (real Redis, three tiny-omni workers, two routers, API keys and a worker token
configured). Each call goes client -> omni-router -> omni-worker and back."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
import soundfile as sf

from tests.reliability.fleet import MODEL, Fleet

# the first test on the live fleet also waits for it to start (minutes on a busy machine)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
VOICE = "chelsie"


def wav_bytes(seconds: float, rate: int = 16_000, freq: float = 330.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), rate, format="WAV")
    return buf.getvalue()


@pytest.fixture
def sdk(omni_fleet: Fleet) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=omni_fleet.routers[0].url + "/v1",
        api_key=omni_fleet.api_key,
        max_retries=0,
        timeout=60,
    )


def test_models(sdk: openai.OpenAI) -> None:
    """The router's list carries what the workers say of each model (voices, capabilities)."""
    models = [m.model_dump() for m in sdk.models.list().data]
    assert [m["id"] for m in models] == [MODEL]
    assert VOICE in models[0]["voices"]
    assert models[0]["capabilities"]["output_modalities"] == ["text", "audio"]
    assert sdk.models.retrieve(MODEL).model_dump()["voices"] == models[0]["voices"]


def test_chat_plain_and_streamed(sdk: openai.OpenAI, omni_fleet: Fleet) -> None:
    messages = [{"role": "user", "content": "Hello through the router."}]
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=10
    )
    assert raw.headers["x-omni-worker-id"] in omni_fleet.workers
    assert raw.headers["x-omni-request-id"]
    out = raw.parse()
    text = out.choices[0].message.content
    assert isinstance(text, str) and text
    assert out.usage is not None and 0 < out.usage.completion_tokens <= 10
    chunks = list(
        sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, stream=True)
    )
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([d for d in deltas if d]) > 1, "text arrives as several deltas"
    assert "".join(deltas) == text  # greedy: the same text on whichever worker served it
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_chat_with_audio_output(sdk: openai.OpenAI) -> None:
    # one session: both calls on one worker, so the streamed audio must equal the whole one
    kwargs = dict(
        extra_headers={"x-session-id": "sdk-audio"},
        model=MODEL,
        modalities=["text", "audio"],
        max_tokens=8,
        messages=[{"role": "user", "content": "Say something."}],
    )
    out = sdk.chat.completions.create(audio={"voice": VOICE, "format": "wav"}, **kwargs)
    message = out.choices[0].message
    assert message.audio is not None and message.audio.transcript == message.content
    wav = base64.b64decode(message.audio.data)
    pcm, rate = sf.read(io.BytesIO(wav), dtype="int16")
    assert rate == 24_000 and pcm.size > 0
    audio: list[bytes] = []
    for chunk in sdk.chat.completions.create(
        audio={"voice": VOICE, "format": "pcm16"}, stream=True, **kwargs
    ):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None and delta.audio is not None and delta.audio.data:
            audio.append(base64.b64decode(delta.audio.data))
    assert len(audio) > 1, "audio streams in several chunks"
    assert b"".join(audio) == wav[44:]


def test_speech_whole_and_streamed(sdk: openai.OpenAI) -> None:
    text = "Hello from the fleet."
    whole = sdk.audio.speech.create(
        model=MODEL, input=text, voice=VOICE, response_format="wav"
    ).content
    assert whole[:4] == b"RIFF" and len(whole) > 44
    with sdk.audio.speech.with_streaming_response.create(
        model=MODEL, input=text, voice=VOICE, response_format="pcm", stream_format="audio"
    ) as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        pieces = list(response.iter_bytes(chunk_size=None))
    assert len(pieces) > 1, "streamed speech arrives in several pieces"
    assert b"".join(pieces) == whole[44:]


def test_transcription(sdk: openai.OpenAI) -> None:
    clip = ("clip.wav", wav_bytes(1.5), "audio/wav")
    first = sdk.audio.transcriptions.create(model=MODEL, file=clip)
    assert isinstance(first.text, str)
    assert sdk.audio.transcriptions.create(model=MODEL, file=clip).text == first.text


def test_same_answer_through_either_router(omni_fleet: Fleet) -> None:
    answers = set()
    for r in omni_fleet.routers:
        client = openai.OpenAI(
            base_url=r.url + "/v1", api_key=omni_fleet.api_key, max_retries=0, timeout=60
        )
        out = client.chat.completions.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "same?"}]
        )
        answers.add(out.choices[0].message.content)
    assert len(answers) == 1


def test_sdk_errors_are_typed(sdk: openai.OpenAI, omni_fleet: Fleet) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        sdk.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert err.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as err:
        sdk.audio.speech.create(model=MODEL, input="x", voice="nobody-here")
    assert err.value.body["code"] == "voice_not_found"
    wrong = openai.OpenAI(
        base_url=omni_fleet.routers[0].url + "/v1", api_key="sk-wrong", max_retries=0
    )
    with pytest.raises(openai.AuthenticationError) as err:
        wrong.models.list()
    assert err.value.body["code"] == "invalid_api_key"


def test_sampling_fields_are_honoured(sdk: openai.OpenAI) -> None:
    """temperature, seed, top_k and stop change what the model says (they were accepted and
    ignored: four seeds at temperature 1 gave one text, stop was not honoured). A seeded
    request gives the same text on whichever worker the router picks."""
    messages = [{"role": "user", "content": "Tell me something new."}]

    def say(**kw: object) -> openai.types.chat.ChatCompletion:
        return sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, **kw)

    greedy = say().choices[0].message.content
    assert say(temperature=0).choices[0].message.content == greedy
    assert say(temperature=1.0, extra_body={"top_k": 1}).choices[0].message.content == greedy
    seeded = [say(temperature=1.0, seed=s).choices[0].message.content for s in (1, 1, 2, 3, 4)]
    assert seeded[0] == seeded[1]
    assert len(set(seeded[1:])) >= 3, seeded
    # a stop text cuts the reply before it (not sent), finish_reason "stop", streamed alike
    assert greedy and len(greedy) > 6
    stop = greedy[4:6]
    expected = greedy[: greedy.find(stop)]
    out = say(stop=[stop, "\x00never"])
    assert out.choices[0].message.content == expected
    assert out.choices[0].finish_reason == "stop"
    chunks = list(sdk.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, stop=stop, stream=True
    ))  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    for bad, param in (({"temperature": 2.5}, "temperature"), ({"top_k": 0}, "top_k")):
        with pytest.raises(openai.BadRequestError) as err:
            say(extra_body=bad)
        assert err.value.param == param or param in str(err.value), err.value
    with pytest.raises(openai.BadRequestError) as err:
        say(stop="x", modalities=["text", "audio"], audio={"voice": VOICE, "format": "wav"})
    assert err.value.param == "stop"


def test_logprobs_whole_and_streamed(sdk: openai.OpenAI) -> None:
    """logprobs + top_logprobs: one entry per token whose texts join into the reply; greedy,
    each chosen token is its own top alternative."""
    kw = dict(
        model=MODEL, messages=[{"role": "user", "content": "Tell me something new."}],
        max_tokens=12, logprobs=True, top_logprobs=3,
    )  # fmt: skip
    out = sdk.chat.completions.create(**kw)  # type: ignore[call-overload]
    choice = out.choices[0]
    entries = choice.logprobs.content
    assert entries and len(entries) == out.usage.completion_tokens
    assert "".join(e.token for e in entries) == choice.message.content
    for e in entries:
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob) and e.logprob <= 0
        assert bytes(e.bytes) == e.token.encode()
    chunks = list(sdk.chat.completions.create(stream=True, **kw))  # type: ignore[call-overload]
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]  # fmt: skip
    # the same tokens; their log probabilities to float rounding (the second request's prompt
    # comes from the prefix cache, computed in another batch)
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-4)
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(**{**kw, "logprobs": False})  # type: ignore[call-overload]
    assert err.value.param == "top_logprobs"


def test_response_format_json_schema_is_met(sdk: openai.OpenAI) -> None:
    """A strict json_schema with enums, met by the random-weight model (constrained decoding);
    a schema the grammar backend cannot take is a 400 naming it."""
    import json

    schema = {
        "type": "object",
        "properties": {"mood": {"enum": ["calm", "loud"]}, "yes": {"type": "boolean"}},
        "required": ["mood", "yes"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "m", "schema": schema, "strict": True}}
    out = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "How do you feel? JSON."}],
        max_tokens=48, response_format=fmt,  # type: ignore[arg-type]
    )  # fmt: skip
    doc = json.loads(out.choices[0].message.content or "")
    assert doc["mood"] in ("calm", "loud") and isinstance(doc["yes"], bool) and len(doc) == 2
    assert out.choices[0].finish_reason == "stop"
    bad = {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "nope"}}}
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=4,
            response_format=bad,  # type: ignore[arg-type]
        )  # fmt: skip
    assert err.value.param == "response_format.json_schema.schema"


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Oslo", "Paris"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
CLOCK_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
    "additionalProperties": False}}}  # fmt: skip


def test_forced_tool_calls_parse_and_fit_their_schema(sdk: openai.OpenAI) -> None:
    """tool_choice naming a function, and required: the random-weight model's reply is one call
    (constrained decoding) whose arguments fit the function's parameters; streamed, the call
    comes as a tool_calls delta; the history takes the call and the tool's result."""
    import json

    ask = [{"role": "user", "content": "Weather in Oslo for 3 days?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    out = sdk.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=128, tools=[WEATHER_TOOL, CLOCK_TOOL],  # type: ignore[list-item]
        tool_choice=named,  # type: ignore[arg-type]
    )  # fmt: skip
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []  # (a byte-level tokenizer: a token a character)
    args = json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert args["city"] in ("Oslo", "Paris") and 1 <= args["days"] <= 7 and len(args) == 2
    required = sdk.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=128, tools=[WEATHER_TOOL, CLOCK_TOOL],  # type: ignore[list-item]
        tool_choice="required", temperature=1.0, seed=3,
    )  # fmt: skip
    (other,) = required.choices[0].message.tool_calls or []
    assert other.function.name in ("get_weather", "get_time")  # type: ignore[union-attr]
    json.loads(other.function.arguments)  # type: ignore[union-attr]
    stream = sdk.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=128, tools=[WEATHER_TOOL, CLOCK_TOOL],  # type: ignore[list-item]
        tool_choice=named, stream=True,  # type: ignore[arg-type]
    )  # fmt: skip
    deltas = [c.choices[0] for c in stream if c.choices]
    calls = [t for d in deltas for t in (d.delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.arguments == call.function.arguments  # type: ignore[union-attr]
    assert deltas[-1].finish_reason == "tool_calls"
    # the call and its result in the history: the next turn's prompt holds both
    history = [
        *ask,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "clear"}'},
    ]
    after = sdk.chat.completions.create(
        model=MODEL, messages=history, max_tokens=4, tools=[WEATHER_TOOL, CLOCK_TOOL],  # type: ignore[arg-type, list-item]
        tool_choice="none",
    )  # fmt: skip
    assert after.choices[0].finish_reason in ("stop", "length")
    assert after.usage.prompt_tokens > out.usage.prompt_tokens  # type: ignore[union-attr]
    plain = sdk.chat.completions.create(model=MODEL, messages=ask, max_tokens=4)
    # tools are in the prompt (auto: the reply is free text the model may fill with calls)
    auto = sdk.chat.completions.create(
        model=MODEL, messages=ask, max_tokens=4, tools=[WEATHER_TOOL]
    )  # type: ignore[list-item]
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens + 50  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(
            model=MODEL, messages=ask, max_tokens=4, tools=[WEATHER_TOOL],  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": "nope"}},  # type: ignore[arg-type]
        )  # fmt: skip
    assert err.value.param == "tool_choice"
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(
            model=MODEL, max_tokens=4, messages=[*ask, {"role": "tool", "content": "x"}],  # type: ignore[list-item]
        )  # fmt: skip
    assert err.value.param == "messages.1.tool_call_id"


def test_n_choices_whole_and_streamed(sdk: openai.OpenAI) -> None:
    """n choices, each its own draws (seed + i with a seed: the set is reproducible); usage
    counts the prompt once and every choice's tokens."""
    kw = dict(
        model=MODEL, messages=[{"role": "user", "content": "Say anything."}], max_tokens=10,
        temperature=1.0, seed=5, n=3,
    )  # fmt: skip
    out = sdk.chat.completions.create(**kw)  # type: ignore[call-overload]
    texts = [c.message.content for c in out.choices]
    assert [c.index for c in out.choices] == [0, 1, 2] and len(set(texts)) >= 2, texts
    assert [c.message.content for c in sdk.chat.completions.create(**kw).choices] == texts
    single = sdk.chat.completions.create(**{**kw, "n": 1, "seed": 6})
    assert single.choices[0].message.content == texts[1]  # choice 1 drew with seed 6
    assert out.usage.completion_tokens > single.usage.completion_tokens
    assert out.usage.prompt_tokens == single.usage.prompt_tokens
    streamed: dict[int, str] = {}
    for c in sdk.chat.completions.create(stream=True, **kw):  # type: ignore[call-overload]
        for choice in c.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert [streamed[i] for i in range(3)] == texts
    for bad in ({"n": 9}, {"n": 2, "modalities": ["text", "audio"],
                           "audio": {"voice": VOICE, "format": "wav"}}):  # fmt: skip
        with pytest.raises(openai.BadRequestError) as err:
            sdk.chat.completions.create(**{**kw, **bad})  # type: ignore[call-overload]
        assert err.value.param == "n"


def test_a_conversation_reuses_its_cached_prefix(sdk: openai.OpenAI) -> None:
    """The second turn of a conversation on the same worker (one session) computes only what is
    new: ``usage.prompt_tokens_details.cached_tokens`` covers the first turn's prompt, whole
    and in streamed usage (SGLang's radix cache under the thinker)."""
    system = {"role": "system", "content": "You answer briefly and exactly. " * 12}
    turn = [system, {"role": "user", "content": "What is an omni model?"}]
    kw = dict(model=MODEL, max_tokens=6, extra_headers={"x-session-id": "sdk-prefix"})
    first = sdk.chat.completions.create(messages=turn, **kw)  # type: ignore[call-overload]
    reply = {"role": "assistant", "content": first.choices[0].message.content}
    follow = [*turn, reply, {"role": "user", "content": "And a talker?"}]
    second = sdk.chat.completions.create(messages=follow, **kw)  # type: ignore[call-overload]
    assert first.usage is not None and second.usage is not None
    cached = second.usage.prompt_tokens_details.cached_tokens
    # (all of the first turn's prompt but where the template writes the reply's start anew)
    assert first.usage.prompt_tokens - 2 <= cached < second.usage.prompt_tokens, (
        first.usage, second.usage,
    )  # fmt: skip
    chunks = list(sdk.chat.completions.create(  # type: ignore[call-overload]
        messages=follow, stream=True, stream_options={"include_usage": True}, **kw
    ))  # fmt: skip
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == second.usage.prompt_tokens
    # all of it this time but the last token, whose logits start the reply
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1
