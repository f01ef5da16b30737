"""Acceptance tests of OpenAI compatibility: the official ``openai`` SDK against the router of
the live fleet (real Redis, three tiny-omni workers, two routers, API keys and a worker token
configured). Each call goes client -> omni-router -> omni-worker and back."""

from __future__ import annotations

import asyncio
import base64
import io
from collections import Counter
from typing import Any

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
        seed=2,  # (the talker samples: one seed, the same speech)
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
    seeded = {"seed": 21}  # (the talker samples: one seed, the same speech)
    whole = sdk.audio.speech.create(
        model=MODEL, input=text, voice=VOICE, response_format="wav", extra_body=seeded
    ).content
    assert whole[:4] == b"RIFF" and len(whole) > 44
    with sdk.audio.speech.with_streaming_response.create(
        model=MODEL, input=text, voice=VOICE, response_format="pcm", stream_format="audio",
        extra_body=seeded,
    ) as response:  # fmt: skip
        assert response.headers.get("transfer-encoding") == "chunked"
        pieces = list(response.iter_bytes(chunk_size=None))
    assert len(pieces) > 1, "streamed speech arrives in several pieces"
    assert b"".join(pieces) == whole[44:]
    # the same seed is the same audio on every worker; another seed other audio
    heard: dict[str, bytes] = {}
    for s in range(12):
        raw = sdk.audio.speech.with_raw_response.create(
            model=MODEL, input=text, voice=VOICE, response_format="pcm", extra_body=seeded,
            extra_headers={"x-session-id": f"sdk-seeded-{s}"},
        )  # fmt: skip
        heard[raw.headers["x-omni-worker-id"]] = raw.content
        if len(heard) > 1:
            break
    assert len(heard) > 1 and set(heard.values()) == {whole[44:]}, sorted(heard)
    other = sdk.audio.speech.create(
        model=MODEL, input=text, voice=VOICE, response_format="pcm", extra_body={"seed": 22}
    ).content
    assert other != whole[44:]
    # OpenAI's voice names are the spec's aliases of the talker's speakers (voice_aliases)
    alias = sdk.audio.speech.create(
        model=MODEL, input=text, voice="alloy", response_format="pcm", extra_body=seeded
    ).content
    assert alias == whole[44:]  # alloy speaks as chelsie
    assert {"alloy", "ash", "verse"} <= set(sdk.models.retrieve(MODEL).model_dump()["voices"])
    # Qwen3-Omni's talker takes no instructions or language (Qwen3-TTS's do): refused, not ignored
    for field, value in (("instructions", "Whisper."), ("language", "english")):
        with pytest.raises(openai.BadRequestError) as err:
            sdk.audio.speech.create(model=MODEL, input=text, voice=VOICE, extra_body={field: value})
        assert err.value.param == field


def test_transcription(sdk: openai.OpenAI) -> None:
    """Qwen3-Omni transcribes; the request's prompt (the system's context) and language hint
    (in the instruction) are read by the model: its prompt grows by each."""
    clip = ("clip.wav", wav_bytes(1.5), "audio/wav")
    first = sdk.audio.transcriptions.create(model=MODEL, file=clip)
    assert isinstance(first.text, str)
    assert sdk.audio.transcriptions.create(model=MODEL, file=clip).text == first.text

    def prompt_tokens(**kw: str) -> int:
        out = sdk.audio.transcriptions.create(model=MODEL, file=clip, **kw)  # type: ignore[call-overload]
        return out.usage.input_tokens

    plain = prompt_tokens()
    assert prompt_tokens(prompt="Names: Oslo, Paris.") > plain
    assert prompt_tokens(language="en") > plain


def test_translation(sdk: openai.OpenAI, omni_fleet: Fleet) -> None:
    """``/v1/audio/translations`` on Qwen3-Omni through the router: OpenAI's shape and formats,
    another prompt than the transcription's (the thinker is asked for English text); the
    transcription's own fields are refused, naming them."""
    clip = ("clip.wav", wav_bytes(1.5), "audio/wav")
    out = sdk.audio.translations.create(model=MODEL, file=clip, response_format="verbose_json")
    assert out.task == "translate" and out.language == "english", out  # type: ignore[attr-defined]
    assert out.duration == 1.5  # type: ignore[attr-defined]
    text = sdk.audio.translations.create(model=MODEL, file=clip, response_format="text")
    assert text == out.text  # (greedy: one answer)
    vtt = sdk.audio.translations.create(model=MODEL, file=clip, response_format="vtt")
    assert vtt.startswith("WEBVTT")  # type: ignore[union-attr]
    said = sdk.audio.transcriptions.create(model=MODEL, file=clip).model_dump()["usage"]
    translated = sdk.audio.translations.create(model=MODEL, file=clip).model_dump()["usage"]
    assert translated["input_tokens"] != said["input_tokens"]  # (another instruction)
    for extra, param in (({"language": "de"}, "language"), ({"stream": "true"}, "stream")):
        with pytest.raises(openai.BadRequestError) as err:
            sdk.audio.translations.create(model=MODEL, file=clip, extra_body=extra)
        assert err.value.param == param, err.value


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


def test_top_p_and_min_p_shape_the_draws(sdk: openai.OpenAI) -> None:
    """On a seeded draw that differs from the greedy reply, a tiny top_p or a min_p of 1 keeps
    only the likeliest token at each step: the greedy reply again (ignored, they would leave
    the draw as it was)."""
    messages = [{"role": "user", "content": "Tell me something new."}]

    def say(**kw: Any) -> str | None:
        out = sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, **kw)
        return out.choices[0].message.content

    greedy = say(temperature=0)
    seed = next(s for s in range(1, 9) if say(temperature=1.0, seed=s) != greedy)
    assert say(temperature=1.0, seed=seed, top_p=1e-6) == greedy
    assert say(temperature=1.0, seed=seed, extra_body={"min_p": 1.0}) == greedy
    assert say(temperature=1.0, seed=seed, top_p=1.0) != greedy


# each sampling field out of its range, and the param the 400 names
OUT_OF_RANGE = [
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": 2.5}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"seed": 2**64}, "seed"),
    ({"n": 9}, "n"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"),  # (outside the vocabulary: SGLang's check)
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 129}, "max_tokens"),  # (over the spec's 128 per reply)
    ({"max_completion_tokens": 129}, "max_completion_tokens"),
]


def test_every_sampling_field_out_of_range_is_a_400_naming_it(sdk: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "hi"}]
    for body, param in OUT_OF_RANGE:
        with pytest.raises(openai.BadRequestError) as err:
            sdk.chat.completions.create(model=MODEL, messages=messages, extra_body=body)
        assert err.value.code == "invalid_request" and err.value.param == param, (body, err.value)
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=500)
    assert "128" in err.value.message and "thinker.engine.max_new_tokens" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        sdk.completions.create(model=MODEL, prompt="x", max_tokens=129)
    assert err.value.param == "max_tokens"
    # the worker refused them; the fleet still answers (no worker was blamed)
    assert sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=128)


def _png(side: int) -> str:
    from PIL import Image

    pixels = np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_message_fields_are_honoured_or_refused(sdk: openai.OpenAI) -> None:
    """developer means system; a speaker name, metadata, stream_options without stream and a
    clip whose container is not its declared format are refused naming the field; an image's
    detail "low" shows the model a smaller image (fewer prompt tokens)."""

    def ask(messages: list, **kw: Any) -> openai.types.chat.ChatCompletion:
        return sdk.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8, temperature=0, **kw
        )

    user = {"role": "user", "content": "What is new?"}
    as_system = ask([{"role": "system", "content": "Be brief."}, user])
    as_developer = ask([{"role": "developer", "content": "Be brief."}, user])
    assert as_developer.choices[0].message.content == as_system.choices[0].message.content
    assert as_developer.usage and as_system.usage
    assert as_developer.usage.prompt_tokens == as_system.usage.prompt_tokens
    wav = base64.b64encode(wav_bytes(0.5)).decode()
    refusals = [
        ([{**user, "name": "ann"}], {}, "messages.0.name"),
        ([user], {"metadata": {"k": "v"}}, "metadata"),
        ([user], {"stream_options": {"include_usage": True}}, "stream_options"),
        ([user], {"store": True}, "store"),
        (
            [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": wav, "format": "mp3"}}]}],
            {}, "messages.0.content.0.input_audio.format",
        ),
    ]  # fmt: skip
    for messages, extra, param in refusals:
        with pytest.raises(openai.BadRequestError) as err:
            ask(messages, **extra)
        assert err.value.param == param, err.value
    heard = ask([{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}]}])  # fmt: skip
    assert heard.choices[0].message.content is not None
    image = _png(768)

    def seen(detail: str) -> int:
        part = {"type": "image_url", "image_url": {"url": image, "detail": detail}}
        out = ask([{"role": "user", "content": [part, {"type": "text", "text": "What?"}]}])
        assert out.usage is not None
        return out.usage.prompt_tokens

    assert seen("low") < seen("high") == seen("auto")


def test_an_assistant_turn_by_its_audio_id_or_its_refusal_is_its_text(
    sdk: openai.OpenAI,
) -> None:
    """An assistant turn given as ``audio: {id}`` (its earlier spoken reply, as OpenAI's audio
    conversations send it) is that reply's transcript, on whichever worker the next turn lands
    (the transcript is kept in Redis); given as ``refusal``, its text is the refusal. Neither
    is dropped: the prompt equals the one with the text as content."""
    user = {"role": "user", "content": "Say something."}
    then = {"role": "user", "content": "And again?"}

    def ask(messages: list, **kw: Any) -> openai.types.chat.ChatCompletion:
        return sdk.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=6, temperature=0, **kw
        )

    spoken = ask([user], modalities=["text", "audio"], audio={"voice": VOICE, "format": "wav"})
    reply = spoken.choices[0].message
    assert reply.audio is not None and reply.audio.transcript
    workers = set()
    for s in range(3):
        raw = sdk.chat.completions.with_raw_response.create(
            model=MODEL, max_tokens=6, temperature=0,
            messages=[user, {"role": "assistant", "audio": {"id": reply.audio.id}}, then],
            extra_headers={"x-session-id": f"sdk-audio-id-{s}"},
        )  # fmt: skip
        workers.add(raw.headers["x-omni-worker-id"])
        by_id = raw.parse()
        as_text = ask([user, {"role": "assistant", "content": reply.audio.transcript}, then])
        assert by_id.usage and as_text.usage
        assert by_id.usage.prompt_tokens == as_text.usage.prompt_tokens
        assert by_id.choices[0].message.content == as_text.choices[0].message.content
    empty = ask([user, {"role": "assistant", "content": ""}, then])
    assert empty.usage and as_text.usage and empty.usage.prompt_tokens < as_text.usage.prompt_tokens
    declined = "I cannot help with that."
    by_refusal = ask([user, {"role": "assistant", "refusal": declined}, then])
    as_content = ask([user, {"role": "assistant", "content": declined}, then])
    assert by_refusal.usage and as_content.usage
    assert by_refusal.usage.prompt_tokens == as_content.usage.prompt_tokens
    refusals = [
        ([user, {"role": "assistant", "audio": {"id": "audio-unknown"}}, then],
         "messages.1.audio.id"),
        ([{**user, "refusal": declined}], "messages.0.refusal"),
        ([user, {"role": "assistant", "content": "other", "refusal": declined}, then],
         "messages.1.refusal"),
        ([user, {"role": "assistant", "content": "other", "audio": {"id": reply.audio.id}}, then],
         "messages.1.audio"),
    ]  # fmt: skip
    for messages, param in refusals:
        with pytest.raises(openai.BadRequestError) as err:
            ask(messages)
        assert err.value.param == param, err.value


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


def _stateless_turns(
    sdk: openai.OpenAI, opening: list[dict], turns: int, salt: str
) -> list[tuple[str, float]]:
    """A conversation as a stateless client holds it (no session id, no `user`): every turn
    resends all before it. (worker, share of the prompt cached) per follow-up turn; the
    first turn's worker first, with share 0."""
    messages = list(opening)
    out = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"Turn {t} of {salt}: what follows?"})
        raw = sdk.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,
            max_tokens=4,
            temperature=0,  # type: ignore[arg-type]
        )
        reply = raw.parse()
        usage = reply.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens or 0
        out.append((raw.headers["x-omni-worker-id"], cached / usage.prompt_tokens))
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    return out


def test_stateless_conversations_land_where_their_prefix_is_cached(
    sdk: openai.OpenAI, omni_fleet: Fleet
) -> None:
    """Six conversations with their own ~800-token system prompts, four turns each, no session
    id, through the router's cache-aware policy: the follow-up turns find their prefix in the
    worker's radix cache (``cached_tokens``), and the conversations still spread. Then the same
    with an audio clip in the first turn."""
    rule = "Answer in one short sentence and never repeat the question. "
    omni_fleet.wait_idle()  # (an earlier test's request still running would pull turns away)
    systems = [{"role": "system", "content": f"You are agent {n}. " + rule * 13} for n in range(6)]
    talks = [_stateless_turns(sdk, [system], 4, f"c{n}") for n, system in enumerate(systems)]
    follow_ups = [share for talk in talks for _, share in talk[1:]]
    assert sum(share >= 0.7 for share in follow_ups) >= 16, follow_ups
    per_worker = Counter(worker for talk in talks for worker, _ in talk)
    counts = [per_worker.get(w, 0) for w in omni_fleet.workers]
    assert max(counts) <= 3 * min(counts) + 1, (per_worker, _loads(omni_fleet))
    omni_fleet.wait_idle()
    openings = []
    for n in range(3):  # each its own clip
        clip = base64.b64encode(wav_bytes(1.0, freq=220.0 + 110 * n)).decode()
        audio = {"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}}
        ask = [audio, {"type": "text", "text": f"{n}: " + rule * 5}]
        openings.append([{"role": "user", "content": ask}, {"role": "assistant", "content": "Ok."}])
    heard = [_stateless_turns(sdk, opening, 3, f"a{n}") for n, opening in enumerate(openings)]
    shares = [share for talk in heard for _, share in talk[1:]]
    assert sum(share >= 0.7 for share in shares) >= 5, shares
    per_worker = Counter(worker for talk in heard for worker, _ in talk)
    counts = [per_worker.get(w, 0) for w in omni_fleet.workers]
    assert max(counts) <= 3 * min(counts) + 1, (per_worker, _loads(omni_fleet))


def _loads(fleet: Fleet) -> dict:
    """What the router saw of each worker, for a failed spread's message."""
    seen = fleet.diagnostics(fleet.routers[0])["workers"]
    keys = ("id", "routable", "in_flight", "requests", "load", "load_age_s")
    return {w["id"]: {k: w.get(k) for k in keys} for w in seen}


def test_text_completions(sdk: openai.OpenAI) -> None:
    """``/v1/completions``: the prompt continued as it is (no chat template), whole and
    streamed alike; several prompts and ``n`` choices ordered by prompt; echo, logprobs, stop,
    token-id prompts; the fields it cannot serve refused with a 400 naming them."""
    prompt = "Once upon a time, in an omni fleet,"
    kw = dict(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    out = sdk.completions.create(**kw)  # type: ignore[call-overload]
    assert out.object == "text_completion" and out.id.startswith("cmpl-")
    (choice,) = out.choices
    assert choice.text and choice.finish_reason in ("length", "stop")
    assert out.usage is not None and out.usage.completion_tokens >= 1
    chat = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=1
    )
    assert (
        chat.usage is not None and out.usage.prompt_tokens < chat.usage.prompt_tokens
    )  # no template
    chunks = list(sdk.completions.create(stream=True, stream_options={"include_usage": True}, **kw))  # type: ignore[call-overload]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == out.usage.prompt_tokens
    )
    # echo; logprobs whose tokens make the text, greedy picks each its own likeliest
    echoed = sdk.completions.create(echo=True, **kw).choices[0].text  # type: ignore[call-overload]
    assert echoed == prompt + choice.text
    lp = sdk.completions.create(logprobs=2, **kw).choices[0].logprobs  # type: ignore[call-overload]
    assert lp is not None and "".join(lp.tokens or []) == choice.text
    for token, logprob, top in zip(
        lp.tokens or [], lp.token_logprobs or [], lp.top_logprobs or [], strict=True
    ):
        assert logprob == pytest.approx(max(top.values())) and top[token] == pytest.approx(logprob)
    # stop cuts before the stop text
    stop = choice.text[3:5]
    cut = sdk.completions.create(stop=[stop], **kw).choices[0]  # type: ignore[call-overload]
    assert cut.text == choice.text[: choice.text.find(stop)] and cut.finish_reason == "stop"
    # several prompts, n choices each, seeded: ordered by prompt, the first prompt's as alone
    sampled = dict(model=MODEL, max_tokens=8, temperature=1.0, seed=7, n=2)
    both = sdk.completions.create(prompt=[prompt, "The router said"], **sampled)  # type: ignore[call-overload]
    alone = sdk.completions.create(prompt=prompt, **sampled)  # type: ignore[call-overload]
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert [c.text for c in both.choices[:2]] == [c.text for c in alone.choices]
    assert both.usage is not None and alone.usage is not None
    assert both.usage.prompt_tokens > alone.usage.prompt_tokens  # each prompt counted once
    # a prompt of token ids
    ids = sdk.completions.create(model=MODEL, prompt=[40, 41, 42, 43], max_tokens=3)
    assert ids.usage is not None and ids.usage.prompt_tokens == 4
    with pytest.raises(openai.BadRequestError):
        sdk.completions.create(model=MODEL, prompt=[40, 10**9], max_tokens=3)
    for bad, param in (
        ({"suffix": "the end"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"echo": True, "logprobs": 1}, "echo"),
        ({"logprobs": 6}, "logprobs"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            sdk.completions.create(**{**kw, **bad})  # type: ignore[call-overload]
        assert err.value.param == param or param in str(err.value), (bad, err.value)


def test_a_completion_prompt_lands_where_its_prefix_is_cached(sdk: openai.OpenAI) -> None:
    """Two completions sharing a long prompt start, no session id: the cache-aware policy sends
    the second where the first was computed, which serves the shared start from its cache."""
    start = "A long shared context for the fleet's completion prefix cache. " * 20
    first = sdk.completions.with_raw_response.create(
        model=MODEL, prompt=start + "One:", max_tokens=2
    )
    second = sdk.completions.with_raw_response.create(
        model=MODEL, prompt=start + "Two:", max_tokens=2
    )
    assert first.headers["x-omni-worker-id"] == second.headers["x-omni-worker-id"]
    usage, before = second.parse().usage, first.parse().usage
    assert usage is not None and usage.prompt_tokens_details is not None and before is not None
    assert (usage.prompt_tokens_details.cached_tokens or 0) >= 0.9 * before.prompt_tokens, usage


def test_responses_are_chat_stored_in_the_fleet(sdk: openai.OpenAI, omni_fleet: Fleet) -> None:
    """``client.responses`` through the routers: a response is the chat completion of the same
    conversation (greedy: the same text and prompt tokens), continued by
    ``previous_response_id`` through the other router (the conversation is in Redis, whichever
    worker serves it), streamed as events the SDK validates strictly, and kept on one worker's
    cache by ``prompt_cache_key``; a function call is one, and its output continues it."""
    import json

    import httpx
    from test_responses_api import events_of

    other = openai.OpenAI(
        base_url=omni_fleet.routers[1].url + "/v1", api_key=omni_fleet.api_key, max_retries=0
    )
    system = {"role": "system", "content": "Be brief."}
    ask = {"role": "user", "content": "Hello through the router."}
    first = sdk.responses.create(
        model=MODEL, instructions="Be brief.", input=ask["content"], max_output_tokens=8
    )
    chat = sdk.chat.completions.create(model=MODEL, messages=[system, ask], max_tokens=8)  # type: ignore[list-item]
    assert first.output_text == chat.choices[0].message.content
    assert first.usage is not None and chat.usage is not None
    assert first.usage.input_tokens == chat.usage.prompt_tokens
    assert first.status == (
        "incomplete" if chat.choices[0].finish_reason == "length" else "completed"
    )
    more = {"role": "user", "content": "And then?"}
    second = other.responses.create(
        model=MODEL, input=more["content"], previous_response_id=first.id, max_output_tokens=6
    )
    history = [ask, {"role": "assistant", "content": first.output_text}, more]
    chat2 = sdk.chat.completions.create(model=MODEL, messages=history, max_tokens=6)  # type: ignore[arg-type]
    assert second.output_text == chat2.choices[0].message.content
    assert other.responses.retrieve(first.id).output_text == first.output_text
    with httpx.Client(
        base_url=omni_fleet.routers[0].url, headers=omni_fleet.auth, timeout=60
    ) as http:
        body = {"model": MODEL, "input": "And then?", "previous_response_id": first.id,
                "max_output_tokens": 6}  # fmt: skip
        events = events_of(http, body)
        assert events[-1].response.output_text == second.output_text
        assert http.get("/v1/responses").status_code == 405
    with sdk.responses.connect(extra_query={"model": MODEL}) as conn:  # the WebSocket mode
        conn.response.create(**body)  # type: ignore[arg-type]
        while (event := conn.recv()).type not in ("response.completed", "response.incomplete"):
            assert event.type != "error", event
        assert event.response.output_text == second.output_text  # type: ignore[union-attr]
    # prompt_cache_key: the second request lands where the first was computed
    key = {"prompt_cache_key": "sdk-responses", "max_output_tokens": 2}
    opening = "A long shared context for the responses prefix cache. " * 12
    a = sdk.responses.with_raw_response.create(model=MODEL, input=opening + "One?", **key)  # type: ignore[arg-type]
    b = sdk.responses.with_raw_response.create(model=MODEL, input=opening + "Two?", **key)  # type: ignore[arg-type]
    assert a.headers["x-omni-worker-id"] == b.headers["x-omni-worker-id"]
    cached = b.parse().usage.input_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached >= 0.9 * a.parse().usage.input_tokens  # type: ignore[union-attr]
    # a forced function call, then its output
    tool = {"type": "function", **WEATHER_TOOL["function"]}  # type: ignore[dict-item]
    asked = "Weather in Oslo for 3 days?"
    named = {"type": "function", "name": "get_weather"}
    call_reply = sdk.responses.create(
        model=MODEL,
        input=asked,
        tools=[tool],
        tool_choice=named,
        max_output_tokens=128,  # type: ignore[list-item,arg-type]
    )
    (call,) = call_reply.output
    assert call.type == "function_call" and call.name == "get_weather"
    args = json.loads(call.arguments)
    assert args["city"] in ("Oslo", "Paris") and 1 <= args["days"] <= 7
    answered = other.responses.create(
        model=MODEL, previous_response_id=call_reply.id, tools=[tool], tool_choice="none",  # type: ignore[list-item]
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "clear"}],
        max_output_tokens=4,
    )  # fmt: skip
    chat_calls = [{"id": call.call_id, "type": "function",
                   "function": {"name": call.name, "arguments": call.arguments}}]  # fmt: skip
    chat3 = sdk.chat.completions.create(
        model=MODEL, max_tokens=4, tools=[WEATHER_TOOL], tool_choice="none",  # type: ignore[list-item]
        messages=[{"role": "user", "content": asked},
                  {"role": "assistant", "content": None, "tool_calls": chat_calls},
                  {"role": "tool", "tool_call_id": call.call_id, "content": "clear"}],  # type: ignore[list-item]
    )  # fmt: skip
    assert answered.output_text == chat3.choices[0].message.content
    other.responses.delete(answered.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(answered.id)


def test_voice_agent_llms_through_the_router(sdk: openai.OpenAI, omni_fleet: Fleet) -> None:
    """The LLMs of the voice-agent frameworks pointed at the router, unchanged: LiveKit's
    Responses LLM over its default WebSocket (two turns: the second sends only the new items
    with ``previous_response_id``) and over HTTP, LiveKit's chat LLM, and Pipecat's
    ``OpenAILLMService`` run by Pipecat's test pipeline; each writes what the SDK's chat
    completion of the same conversation writes (greedy). Each is held to a JSON schema, so that
    its reply ends by itself: LiveKit raises on a reply cut at its token limit."""
    from livekit.agents import llm as lkllm
    from livekit.agents import utils
    from livekit.plugins import openai as lk
    from loguru import logger
    from pipecat.frames.frames import ErrorFrame, LLMContextFrame, LLMTextFrame
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.services.openai.llm import OpenAILLMService
    from pipecat.tests.utils import run_test

    logger.remove()
    router, key = omni_fleet.routers[0].url, omni_fleet.api_key
    ask, more = "Hello from an agent.", "And then?"
    schema = {"name": "m", "strict": True, "schema": {
        "type": "object", "properties": {"mood": {"enum": ["calm", "loud"]}},
        "required": ["mood"], "additionalProperties": False}}  # fmt: skip
    as_text = {"text": {"format": {"type": "json_schema", **schema}}}  # the Responses API's
    as_chat = {"response_format": {"type": "json_schema", "json_schema": schema}}

    def chat(messages: list[dict]) -> str:
        out = sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=48, **as_chat)  # type: ignore[call-overload]
        assert out.choices[0].finish_reason == "stop"
        return out.choices[0].message.content or ""

    async def said(model: lkllm.LLM, ctx: lkllm.ChatContext) -> str:
        extra = as_chat if isinstance(model, lk.LLM) else as_text
        async with model.chat(chat_ctx=ctx, extra_kwargs=extra) as stream:
            return "".join([c.delta.content async for c in stream if c.delta and c.delta.content])

    async def run() -> dict[str, list[str]]:
        heard: dict[str, list[str]] = {}
        ws_url = router.replace("http", "ws", 1) + "/v1/responses"  # (LiveKit's socket URL)
        models = {
            "responses-ws": lk.responses.LLM(model=MODEL, api_key=key, max_output_tokens=48,
                                             base_url=ws_url),
            "responses-http": lk.responses.LLM(model=MODEL, api_key=key, max_output_tokens=48,
                                               base_url=router + "/v1", use_websocket=False),
            "chat": lk.LLM(model=MODEL, api_key=key, max_completion_tokens=48,
                           base_url=router + "/v1"),
        }  # fmt: skip
        utils.http_context._new_session_ctx()
        try:
            for name, model in models.items():
                ctx = lkllm.ChatContext()
                ctx.add_message(role="user", content=ask)
                first = await said(model, ctx)
                ctx.add_message(role="assistant", content=first)
                ctx.add_message(role="user", content=more)
                heard[name] = [first, await said(model, ctx)]
                await model.aclose()
        finally:
            await utils.http_context._close_http_ctx()
        settings = OpenAILLMService.Settings(model=MODEL, max_completion_tokens=48, extra=as_chat)
        pipecat = OpenAILLMService(api_key=key, base_url=router + "/v1", settings=settings)
        context = LLMContext(messages=[{"role": "user", "content": ask}])
        frames, _ = await run_test(pipecat, frames_to_send=[LLMContextFrame(context)])
        assert not [f for f in frames if isinstance(f, ErrorFrame)], frames
        heard["pipecat"] = ["".join(f.text for f in frames if isinstance(f, LLMTextFrame))]
        return heard

    heard = asyncio.run(run())
    first = chat([{"role": "user", "content": ask}])
    said_first = {"role": "assistant", "content": first}
    second = chat([{"role": "user", "content": ask}, said_first, {"role": "user", "content": more}])
    # LiveKit's Responses LLM sends the items after the ones of its last request: the reply it
    # got back too, which the stored response already holds (as against OpenAI's API: the
    # conversation is the previous response's, then the input)
    resent = chat([{"role": "user", "content": ask}, said_first, said_first,
                   {"role": "user", "content": more}])  # fmt: skip
    assert heard == {
        "responses-ws": [first, resent], "responses-http": [first, resent],
        "chat": [first, second], "pipecat": [first],
    }  # fmt: skip


def test_livekit_realtime_model_through_the_router(sdk: openai.OpenAI, omni_fleet: Fleet) -> None:
    """LiveKit's ``RealtimeModel`` pointed at the router, unchanged (the GA protocol): a text
    turn writes what the chat completion of the same conversation writes; its periodic
    reconnect (``max_session_duration``, 20 minutes by default: here seconds) opens a new
    socket and replays the conversation with ``conversation.item.create``, and the next turn
    answers the whole of it; an audio turn ends by the default ``semantic_vad`` (Smart Turn)
    and is answered in speech, and a barge-in's truncation of that speech is confirmed."""
    from livekit import rtc
    from livekit.agents import utils
    from livekit.plugins import openai as lk

    from tests.spoken import pcm_frames, speech_pcm

    router, key = omni_fleet.routers[0].url, omni_fleet.api_key
    ask, more = "Hello from LiveKit.", "And then?"

    def frames(pcm: bytes) -> list[rtc.AudioFrame]:
        return pcm_frames(pcm, 20, lambda b: rtc.AudioFrame(b, 24_000, 1, len(b) // 2))

    async def answer(session, text: str | None = None) -> tuple[str, int, str]:  # type: ignore[no-untyped-def]
        if text is not None:
            ctx = session.chat_ctx.copy()
            ctx.add_message(role="user", content=text)
            await session.update_chat_ctx(ctx)
            created = await asyncio.wait_for(session.generate_reply(), 60)
        else:
            created = await asyncio.wait_for(generations.get(), 60)
        words, samples, item = [], 0, ""
        async for message in created.message_stream:
            item = message.message_id

            async def audio(m=message) -> int:  # type: ignore[no-untyped-def]
                return sum([f.samples_per_channel async for f in m.audio_stream])

            counted = asyncio.create_task(audio())
            words += [piece async for piece in message.text_stream]
            samples += await counted
        return "".join(words), samples, item

    generations: asyncio.Queue = asyncio.Queue()

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        utils.http_context._new_session_ctx()
        try:
            model = lk.realtime.RealtimeModel(
                model=MODEL, base_url=router + "/v1", api_key=key, modalities=["text"],
                max_session_duration=12,  # (LiveKit's is 20 minutes; after the first turn)
            )  # fmt: skip
            session = model.session()
            reconnected = asyncio.Event()
            session.on("session_reconnected", lambda _: reconnected.set())
            out["first"] = (await answer(session, ask))[0]
            await asyncio.wait_for(reconnected.wait(), 60)
            # (the replayed items, once the new socket confirmed them: a turn sent earlier
            # would find LiveKit's copy of the conversation empty and send it all again)
            for _ in range(300):
                if len(session.chat_ctx.items) == 2:
                    break
                await asyncio.sleep(0.1)
            out["second"] = (await answer(session, more))[0]
            await session.aclose()
            await model.aclose()
            spoken = lk.realtime.RealtimeModel(model=MODEL, base_url=router + "/v1", api_key=key)
            session = spoken.session()
            server_events: list[str] = []
            session.on("openai_server_event_received", lambda ev: server_events.append(ev["type"]))
            session.on("generation_created", generations.put_nowait)
            for _ in range(3):  # (the talker samples: a reply may end before its first frame)
                for piece in (bytes(9_600), speech_pcm(1.5, seed=9), bytes(48_000)):
                    for frame in frames(piece):
                        session.push_audio(frame)
                        await asyncio.sleep(0.02)
                text, samples, item = await answer(session)
                if samples:
                    break
            out["spoken"] = (bool(text), samples > 0)
            # (the talker samples: its reply may be a few frames long; cut inside what it said)
            heard_ms = max(1, samples * 1000 // 24_000 // 2)
            session.truncate(message_id=item, modalities=["audio", "text"], audio_end_ms=heard_ms)
            for _ in range(100):
                if "conversation.item.truncated" in server_events:
                    break
                await asyncio.sleep(0.1)
            out["events"] = server_events
            await session.aclose()
            await spoken.aclose()
        finally:
            await utils.http_context._close_http_ctx()
        return out

    out = asyncio.run(run())

    def chat(messages: list[dict]) -> str:
        reply = sdk.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
        return reply.choices[0].message.content or ""

    first = chat([{"role": "user", "content": ask}])
    assert out["first"] == first
    history = [{"role": "user", "content": ask}, {"role": "assistant", "content": first},
               {"role": "user", "content": more}]  # fmt: skip
    assert out["second"] == chat(history)
    assert out["spoken"] == (True, True)
    events = out["events"]
    heard = ("speech_started", "speech_stopped", "committed")
    for kind in (*(f"input_audio_buffer.{k}" for k in heard), "response.done",
                 "conversation.item.truncated"):  # fmt: skip
        assert kind in events, (kind, events)
