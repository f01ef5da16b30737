"""Function calling's parts that need no model: the request checks (a 400 naming the field),
the grammar of a forced call, taking ``<tool_call>`` blocks out of a reply whole and streamed
in any cut, and the tiny Qwen3-Omni chat template's tools layout (unchanged prompts without)."""

from __future__ import annotations

import json
import random

import pytest

from fleet.errors import OmniError
from worker.api.schemas import ChatRequest
from worker.api.tools import CLOSE, OPEN, Calls, ToolUse, tool_use

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}


def body(**extra) -> ChatRequest:
    return ChatRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    )


def use(choice: str = "auto", **kw) -> ToolUse:
    return ToolUse([WEATHER, CLOCK], choice, **kw)


def ids(k: int) -> str:
    return f"call-{k}"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "required",
          "response_format": {"type": "json_object"}}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "strnig"}}}}}],
          "tool_choice": "required"}, "tools.0.function.parameters"),
    ],
)  # fmt: skip
def test_bad_tool_requests_name_their_field(extra: dict, param: str) -> None:
    with pytest.raises(OmniError) as err:
        tool_use(body(**extra), grammars_available=True)
    assert err.value.status == 400 and err.value.param == param, err.value


def test_a_forced_call_needs_xgrammar() -> None:
    with pytest.raises(OmniError) as err:
        tool_use(body(tools=[WEATHER], tool_choice="required"), grammars_available=False)
    assert err.value.param == "tool_choice" and "xgrammar" in err.value.message


def test_choices_and_their_grammar() -> None:
    assert tool_use(body(), True) is None
    auto = tool_use(body(tools=[WEATHER, CLOCK]), True)
    assert auto is not None and auto.choice == "auto" and auto.grammar() is None
    assert auto.stops() == ()
    single = tool_use(body(tools=[WEATHER, CLOCK], parallel_tool_calls=False), True)
    assert single is not None and single.stops() == (CLOSE,)
    named = tool_use(
        body(tools=[WEATHER, CLOCK],
             tool_choice={"type": "function", "function": {"name": "get_weather"}}),
        True,
    )  # fmt: skip
    assert named is not None
    schema = json.loads(named.grammar().schema)  # type: ignore[union-attr]
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert schema["properties"]["arguments"] == WEATHER["function"]["parameters"]
    required = tool_use(body(tools=[WEATHER, CLOCK], tool_choice="required"), True)
    anyof = json.loads(required.grammar().schema)["anyOf"]  # type: ignore[union-attr]
    assert [s["properties"]["name"]["const"] for s in anyof] == ["get_weather", "get_time"]
    assert anyof[1]["properties"]["arguments"] == {"type": "object"}


REPLY = (
    "Let me look. "
    + OPEN + '\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n' + CLOSE
    + " and " + OPEN + '{"name": "not_a_tool", "arguments": {}}' + CLOSE
    + OPEN + '{"name": "get_time", "arguments": {}}' + CLOSE + " done <tool"
)  # fmt: skip


def whole(reply: str, u: ToolUse) -> tuple[str, list[dict], str]:
    c = Calls(u, ids)
    sent, found = c.feed(reply)
    rest, more = c.finish()
    return sent + rest, found + more, c.finish_reason("stop")


def test_auto_takes_the_calls_of_listed_functions_out_of_the_text() -> None:
    text, calls, reason = whole(REPLY, use())
    assert text == (
        "Let me look.  and " + OPEN + '{"name": "not_a_tool", "arguments": {}}' + CLOSE
        + " done <tool"
    )  # fmt: skip
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in calls] == [("call-0", "get_weather", {"city": "Oslo"}),
                                ("call-1", "get_time", {})]  # fmt: skip
    assert reason == "tool_calls"
    assert whole("no calls here", use()) == ("no calls here", [], "stop")


def test_streamed_in_any_cut_the_same_text_and_calls() -> None:
    want = whole(REPLY, use())
    rng = random.Random(5)
    for _ in range(50):
        c = Calls(use(), ids)
        text, calls, at = "", [], 0
        while at < len(REPLY):
            step = rng.randint(1, 7)
            sent, found = c.feed(REPLY[at : at + step])
            assert OPEN not in sent or "not_a_tool" in sent  # a call's text never goes out
            text, calls, at = text + sent, calls + found, at + step
        rest, more = c.finish()
        assert (text + rest, calls + more, c.finish_reason("stop")) == want


def test_a_last_call_cut_by_its_stop_is_still_a_call() -> None:
    text, calls, reason = whole(
        "ok " + OPEN + '{"name": "get_time", "arguments": {}}', use(parallel=False)
    )
    assert (text, [c["function"]["name"] for c in calls], reason) == ("ok ", ["get_time"],
                                                                       "tool_calls")  # fmt: skip


def test_a_forced_call_is_the_whole_reply() -> None:
    text, calls, reason = whole('{"name": "get_weather", "arguments": {"city": "Paris"}}',
                                use("required"))  # fmt: skip
    assert text == "" and reason == "tool_calls"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}


def test_the_tiny_template_lays_out_tools_and_their_turns(tmp_path) -> None:
    from transformers import AutoTokenizer

    from worker.models.qwen3_omni.tiny import build_tokenizer

    build_tokenizer(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    plain = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
    # without tools, the layout the reference tests were written against
    assert text == (
        "<|im_start|>systembe brief<|im_end|>\n<|im_start|>userhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    turns = [
        *plain,
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]  # fmt: skip
    text = tok.apply_chat_template(
        turns, tools=[WEATHER], tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nbe brief\n\n# Tools\n")
    assert json.dumps(WEATHER) in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Oslo"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
    ) in text


def test_a_strict_functions_call_that_does_not_fit_stays_text() -> None:
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    u = ToolUse([strict], "auto")
    bad = OPEN + '{"name": "get_weather", "arguments": {"city": "Rome"}}' + CLOSE
    good = OPEN + '{"name": "get_weather", "arguments": {"city": "Paris"}}' + CLOSE
    assert whole(bad, u) == (bad, [], "stop")
    text, calls, reason = whole(good, u)
    assert text == "" and reason == "tool_calls" and len(calls) == 1
    # not strict: the call is the model's, fitting or not
    assert len(whole(bad, use())[1]) == 1


@pytest.mark.parametrize(
    ("tools", "choice", "where"),
    [
        ([], "required", "session.tools"),
        ([{"type": "function", "name": "f"}] * 2, "auto", "session.tools"),
        ([{"type": "function", "name": "f"}], {"type": "function", "name": "g"},
         "session.tool_choice"),
        ([{"type": "function", "name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "strnig"}}}}], "required",
         "session.tools.0.parameters"),
    ],
)  # fmt: skip
def test_realtime_tools_are_checked_as_chat_s_and_named_in_the_ga_shape(
    tools: list[dict], choice: str | dict, where: str
) -> None:
    from worker.api.realtime.events import RealtimeError
    from worker.api.realtime.planning import tool_use as realtime_tool_use

    with pytest.raises(RealtimeError) as err:
        realtime_tool_use(tools, choice, "session")
    assert err.value.param == where, err.value
