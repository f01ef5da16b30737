"""The Responses API (``/v1/responses``) on a worker in-process over real HTTP, against the
FakePipeline (which answers ``echo <last user text>``) and a real Redis: what each input item
becomes in the chat the pipeline runs, every event of a streamed response validated by the
openai SDK's own models in strict mode, stored responses (continued, listed, deleted, scoped by
API key), and the refusals, each naming its field. Through the router on the real model:
tests/test_openai_sdk.py."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.responses import Response as SDKResponse
from openai.types.responses import ResponsesServerEvent, ResponseStreamEvent
from pydantic import TypeAdapter
from test_worker_http import TOKEN, Running, serve_in_thread, wav_bytes

from fleet.api_keys import API_KEY_ID_HEADER
from planner.spec import ModelSpec
from worker.settings import WorkerSettings

MODEL = "fake-chat"
SPEC = ModelSpec.model_validate(
    {
        "name": MODEL,
        "model_dir": ".",
        "capabilities": {
            "endpoints": ["chat", "responses"],
            "input_modalities": ["text", "audio", "image"],
        },
        "entry": "thinker",
        "stages": {"thinker": {"executor": "autoregressive", "terminal": True}},
    }
)
EVENTS: TypeAdapter = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def worker(redis_server) -> Iterator[Running]:
    settings = WorkerSettings(_cli_parse_args=[], token=TOKEN)
    yield from serve_in_thread(settings, redis_server.url, spec=SPEC)


@pytest.fixture
def sdk(worker: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=worker.url + "/v1", api_key=TOKEN, max_retries=0, timeout=10)


@pytest.fixture
def http(worker: Running) -> Iterator[httpx.Client]:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=worker.url, headers=auth, timeout=10) as client:
        yield client


def strict(response: httpx.Response) -> SDKResponse:
    assert response.status_code == 200, response.text
    return TypeAdapter(SDKResponse).validate_json(response.content, strict=True)


def events_of(http: httpx.Client, body: dict) -> list:
    """A streamed response's events, each validated strictly by the SDK's models, numbered
    from 0 without a gap, each SSE ``event:`` line naming its data's type."""
    out = []
    with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith(
            "text/event-stream"
        )
        kind = None
        for line in reply.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                event = EVENTS.validate_json(line[6:], strict=True)
                assert event.type == kind and event.sequence_number == len(out)
                out.append(event)
    return out


def test_text_whole_streamed_and_continued(sdk: openai.OpenAI, worker: Running, http) -> None:
    first = sdk.responses.create(model=MODEL, input="hello there", instructions="Be brief.")
    assert first.output_text == "echo hello there" and first.status == "completed"
    assert first.usage is not None and first.usage.output_tokens == 3
    seen = worker.pipeline.seen[-1]
    assert seen.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"},
    ]
    strict(http.get(f"/v1/responses/{first.id}"))  # the stored object, as the SDK reads it
    # continued: the earlier input and output come back from Redis; instructions do not
    second = sdk.responses.create(model=MODEL, input="and then", previous_response_id=first.id)
    assert second.output_text == "echo and then"
    assert worker.pipeline.seen[-1].messages == [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "echo hello there"},
        {"role": "user", "content": "and then"},
    ]
    # streamed: the same output, as the SDK's events
    events = events_of(
        http, {"model": MODEL, "input": "and then", "previous_response_id": first.id}
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
    ]  # fmt: skip
    assert kinds[-4:] == [
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == 3 and "".join(deltas) == second.output_text
    assert events[-1].response.output_text == second.output_text
    assert events[-1].response.previous_response_id == first.id
    # the SDK's own stream helper accumulates the same response
    with sdk.responses.stream(model=MODEL, input="once more") as stream:
        final = stream.get_final_response()
    assert final.output_text == "echo once more"


def test_items_become_the_chat_the_model_reads(sdk: openai.OpenAI, worker: Running) -> None:
    wav = base64.b64encode(wav_bytes(0.5)).decode()
    items = [
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "look: "},
            {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
        ]},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "I will check.", "annotations": []},
        ]},
        {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "look", "arguments": "{\"x\": 1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [
            {"type": "input_text", "text": "two"},
        ]},
    ]  # fmt: skip
    tool = {"type": "function", "name": "look", "parameters": {"type": "object"}}
    out = sdk.responses.create(model=MODEL, input=items, tools=[tool])  # type: ignore[arg-type,list-item]
    messages = worker.pipeline.seen[-1].messages
    assert messages[0] == {"role": "system", "content": "Rules."}
    assert messages[1]["content"][0] == {"type": "text", "text": "look: "}
    assert messages[1]["content"][1]["type"] == "audio"
    # the assistant's text and both calls: one turn, as the chat template writes it
    assert messages[2]["content"] == "I will check."
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert messages[3:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    ]
    assert worker.pipeline.seen[-1].tools[0]["function"]["name"] == "look"
    # the input items, stored with ids, listed newest first
    listed = sdk.responses.input_items.list(out.id)
    assert [i.type for i in listed.data][:2] == ["function_call_output", "function_call_output"]
    assert len(listed.data) == len(items) and all(i.id for i in listed.data)
    asc = sdk.responses.input_items.list(out.id, order="asc", limit=2)
    assert [i.type for i in asc.data] == ["message", "message"] and asc.has_more


def test_stored_responses_are_scoped_deleted_and_optional(
    sdk: openai.OpenAI, http: httpx.Client
) -> None:
    mine = {API_KEY_ID_HEADER: "key-a"}
    made = http.post("/v1/responses", json={"model": MODEL, "input": "hi"}, headers=mine)
    rid = strict(made).id
    assert http.get(f"/v1/responses/{rid}", headers=mine).status_code == 200
    # another API key (the router's key id) does not see it, nor can it continue from it
    other = {API_KEY_ID_HEADER: "key-b"}
    assert http.get(f"/v1/responses/{rid}", headers=other).status_code == 404
    cont = {"model": MODEL, "input": "x", "previous_response_id": rid}
    refused = http.post("/v1/responses", json=cont, headers=other)
    assert refused.status_code == 404 and refused.json()["error"]["param"] == "previous_response_id"
    deleted = http.delete(f"/v1/responses/{rid}", headers=mine)
    assert deleted.json() == {"id": rid, "object": "response", "deleted": True}
    assert http.get(f"/v1/responses/{rid}", headers=mine).status_code == 404
    # store: false answers and keeps nothing
    unkept = sdk.responses.create(model=MODEL, input="hi", store=False)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(unkept.id)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"tools": [{"type": "function", "name": "f", "bogus": 1}]}, "tools.0.bogus"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"truncation": "auto"}, "truncation"),
        ({"service_tier": "priority"}, "service_tier"),
        ({"include": ["reasoning.encrypted_content"]}, "include.0"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"text": {"format": {"type": "json_schema"}}}, "text.format"),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"modalities": ["audio"]}, "modalities"),
        ({"input": [{"type": "web_search_call", "id": "x"}]}, "input.0.type"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input.0.content.0"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
         "input.0.content.0"),
        ({"input": [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]},
         "input.0.content.0"),
        ({"input": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "bm90IGF1ZGlv"}}]}]},
         "input.0.content.0.input_audio"),
        ({"input": []}, "input"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(http: httpx.Client, extra: dict, param: str) -> None:
    body = {"model": MODEL, "input": "hi", **extra}
    reply = http.post("/v1/responses", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    assert error["code"] == ("invalid_audio" if "audio" in param else "invalid_request")


def test_unknown_previous_response_and_methods(http: httpx.Client) -> None:
    body = {"model": MODEL, "input": "hi", "previous_response_id": "resp-nope"}
    reply = http.post("/v1/responses", json=body)
    assert reply.status_code == 404 and reply.json()["error"]["param"] == "previous_response_id"
    assert http.get("/v1/responses/resp-nope?include=x").json()["error"]["param"] == "include"
    assert http.get("/v1/responses/resp-nope/input_items?limit=0").status_code == 400


def test_websocket_mode(sdk: openai.OpenAI, worker: Running) -> None:
    """The SDK's ``client.responses.connect()``: one response after another on one socket,
    each event strictly an SDK server event; a mistake is an error event naming the field,
    and the socket serves on."""
    server_events: TypeAdapter = TypeAdapter(ResponsesServerEvent)

    def until_done(conn) -> list:
        out = []
        while not out or out[-1].type not in ("response.completed", "response.incomplete", "error"):
            out.append(server_events.validate_json(conn.recv_bytes(), strict=True))
        return out

    with sdk.responses.connect() as conn:
        conn.response.create(model=MODEL, input="hello there", instructions="Be brief.")
        first = until_done(conn)
        assert first[0].type == "response.created" and first[-1].type == "response.completed"
        assert [e.sequence_number for e in first] == list(range(len(first)))
        answer = first[-1].response
        assert answer.output_text == "echo hello there"
        conn.response.create(
            model=MODEL, input=[{"role": "user", "content": "x"}], reasoning={"effort": "low"}
        )  # type: ignore[list-item]
        (error,) = until_done(conn)
        assert error.type == "error" and error.status == 400 and error.error.param == "reasoning"
        conn.response.create(model=MODEL, input="and then", previous_response_id=answer.id)
        second = until_done(conn)[-1].response
        assert second.output_text == "echo and then" and second.id != answer.id
    assert worker.pipeline.seen[-1].messages[-2:] == [
        {"role": "assistant", "content": "echo hello there"},
        {"role": "user", "content": "and then"},
    ]
