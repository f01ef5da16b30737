"""OpenAI's Responses API on the chat pipeline: ``POST /v1/responses`` (text, function tools,
structured output, streamed events), ``GET``/``DELETE /v1/responses/{id}`` and
``GET /v1/responses/{id}/input_items``.

A Responses request is a chat request in another dress: its ``instructions`` and input items
(messages with text, image and audio parts, earlier ``function_call`` and
``function_call_output`` items) become chat messages, its fields chat's, and it runs as
``/v1/chat/completions`` runs (``worker.api.chat.admitted_chat``: the same checks, tools and
constrained decoding). A 400 names the Responses field, not the chat field it became.

Stored responses (``store``, true unless set false) live in Redis (``fleet.responses``):
``previous_response_id`` continues a conversation on whichever worker the router picks, and a
retried or replayed request stores the same response under the same id (``worker.api.replay``).
The reply is the Response object, or with ``stream`` its events (``response.created`` ...
``response.completed``), each with its ``sequence_number``, an output item per message or call.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import redis.exceptions
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.requests import HTTPConnection
from starlette.websockets import WebSocketDisconnect

from fleet.api_keys import API_KEY_ID_HEADER
from fleet.errors import ErrorCode, OmniError
from fleet.records import Endpoint
from fleet.responses import StoredResponse
from worker.api import limits
from worker.api.chat import ChatTurn, admitted_chat, calls_of, logprobs_json
from worker.api.common import closed_response, read_event, read_json, service_of
from worker.api.errors import from_pydantic, stage_error
from worker.api.generation import merged_events
from worker.api.realtime.endpoint import authorised
from worker.api.replay import CREATED_HEADER, REQUEST_ID_HEADER, created, reply_id
from worker.api.schemas import (
    ChatRequest,
    ResponseFunctionCall,
    ResponseFunctionCallOutput,
    ResponseFunctionTool,
    ResponseInputAudio,
    ResponseInputImage,
    ResponseInputText,
    ResponseMessage,
    ResponseOutputText,
    ResponseRefusal,
    ResponsesRequest,
)
from worker.api.speech_stream import POLICY_VIOLATION
from worker.api.textgen import bad, collect_all, event_stream
from worker.contract.pipeline import Finished, StageFailed, TextDelta, TokenLogprob
from worker.service import WorkerService

router = APIRouter()
log = logging.getLogger(__name__)

# what ``include`` can ask for here: the output text's log probabilities
_INCLUDABLE = frozenset({"message.output_text.logprobs"})
# OpenAI's hosted features, refused when set: the field, and why
_UNSERVED = {
    "background": "background responses are not served: omit it (or set it false)",
    "conversation": "the Conversations API is not served: continue with previous_response_id",
    "prompt": "stored prompt templates are not served: send the instructions and input",
    "reasoning": "this model has no reasoning controls",
    "max_tool_calls": "max_tool_calls is not served: tool calls are limited by the reply alone",
    "prompt_cache_retention": "the prompt cache keeps what its memory holds; it takes no "
    "retention: use prompt_cache_key to keep a conversation on one worker",
}
# chat's fields as the Responses API names them (a 400 from the chat checks names these)
_CHAT_PARAMS = {
    "response_format": "text.format",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "logprobs": "include",
    "user": "prompt_cache_key",
}
_ITEMS: dict[str, type[BaseModel]] = {
    "message": ResponseMessage,
    "function_call": ResponseFunctionCall,
    "function_call_output": ResponseFunctionCallOutput,
}


# the parts a message may hold (input_file: no files are kept here)
_PARTS = ("input_text", "input_image", "input_audio", "output_text", "refusal")


def _owner(request: HTTPConnection) -> str:
    return request.headers.get(API_KEY_ID_HEADER, "")


# -- the request: checked, then turned into chat ------------------------------------------------


def _refuse_unserved(body: ResponsesRequest) -> None:
    for field, why in _UNSERVED.items():
        value = getattr(body, field)
        if value not in (None, False, {}):
            raise bad(why, field)
    if body.truncation == "auto":
        raise bad(
            "truncation 'auto' is not served: a conversation is never cut (one over the context "
            "is refused with context_length_exceeded)",
            "truncation",
        )
    if body.service_tier not in (None, "auto", "default"):
        raise bad(f"service_tier {body.service_tier!r} is not served: use 'auto'", "service_tier")
    if body.stream_options is not None:
        if not body.stream:
            raise bad("stream_options needs stream: true", "stream_options")
        if body.stream_options.include_obfuscation:
            raise bad(
                "obfuscation padding is not written: set include_obfuscation false",
                "stream_options.include_obfuscation",
            )
    for i, name in enumerate(body.include or ()):
        if name not in _INCLUDABLE:
            served = sorted(_INCLUDABLE)
            raise bad(f"include {name!r} is not served (only {served})", f"include.{i}")
    if body.text is not None and body.text.verbosity is not None:
        raise bad("this model has no verbosity control", "text.verbosity")


def _items(raw: list[dict], where: str) -> list[BaseModel]:
    """Input items, each checked as its type (a wrong one named by its place: ``input.3...``)."""
    out: list[BaseModel] = []
    for k, item in enumerate(raw):
        param = f"{where}.{k}"
        kind = item.get("type", "message" if "role" in item else None)
        model = _ITEMS.get(kind) if isinstance(kind, str) else None
        if model is None:
            served = ", ".join(_ITEMS)
            message = f"input item type {kind!r} is not served here (only {served})"
            raise bad(message, param + ".type")
        content = item.get("content")
        for j, part in enumerate(
            content if model is ResponseMessage and type(content) is list else ()
        ):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in _PARTS:
                served = ", ".join(_PARTS)
                message = f"content part type {kind!r} is not served here (only {served})"
                raise bad(message, f"{param}.content.{j}")
        try:
            out.append(model.model_validate(item))
        except ValidationError as exc:
            err = from_pydantic(exc)
            err.param = f"{param}.{err.param}" if err.param else param
            err.message = f"{param}.{err.message}"
            raise err from None
    return out


def _normalized(items: list[BaseModel], item_ids: str) -> list[dict]:
    """The input items as they are stored and listed: every one with an id and a status, a
    message's content as a list of parts."""
    out = []
    for k, item in enumerate(items):
        doc = item.model_dump(exclude_none=True, by_alias=True)
        doc.setdefault("id", f"{item_ids}-{k}")
        doc["status"] = doc.get("status", "completed")
        if isinstance(item, ResponseMessage) and isinstance(item.content, str):
            kind = "output_text" if item.role == "assistant" else "input_text"
            part: dict = {"type": kind, "text": item.content}
            if kind == "output_text":
                part["annotations"] = []
            doc["content"] = [part]
        out.append(doc)
    return out


def _chat_messages(items: list[BaseModel], origins: list[str]) -> tuple[list[dict], list[str]]:
    """Chat messages of the items; beside each, the Responses param it came from."""
    messages: list[dict] = []
    where: list[str] = []
    for item, origin in zip(items, origins, strict=True):
        if isinstance(item, ResponseFunctionCall):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "refusal" not in last:
                last.setdefault("tool_calls", []).append(call)  # one turn: its text, its calls
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                where.append(origin)
            continue
        if isinstance(item, ResponseFunctionCallOutput):
            output = item.output
            text = output if isinstance(output, str) else "".join(p.text for p in output)
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": text})
            where.append(origin)
            continue
        assert isinstance(item, ResponseMessage)
        messages.append(_chat_message(item, origin))
        where.append(origin)
    return messages, where


def _chat_message(item: ResponseMessage, origin: str) -> dict:
    if isinstance(item.content, str):
        return {"role": item.role, "content": item.content}
    assistant = item.role == "assistant"
    if assistant:  # an earlier reply: its text, or its refusal
        texts, refusals = [], []
        for j, part in enumerate(item.content):
            if isinstance(part, ResponseOutputText):
                texts.append(part.text)
            elif isinstance(part, ResponseRefusal):
                refusals.append(part.refusal)
            else:
                raise bad(
                    f"an assistant message holds output_text or refusal parts, not {part.type}",
                    f"{origin}.content.{j}",
                )
        if refusals and texts:
            raise bad("an assistant message is its text or its refusal, not both", origin)
        if refusals:
            return {"role": "assistant", "refusal": "".join(refusals)}
        return {"role": "assistant", "content": "".join(texts)}
    parts: list[dict] = []
    for j, part in enumerate(item.content):
        param = f"{origin}.content.{j}"
        if isinstance(part, ResponseInputText):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, ResponseInputImage):
            if part.file_id is not None or part.image_url is None:
                raise bad("an image is given by its image_url (no files are kept here)", param)
            url = {"url": part.image_url, "detail": part.detail or "auto"}
            parts.append({"type": "image_url", "image_url": url})
        elif isinstance(part, ResponseInputAudio):
            parts.append(part.model_dump(exclude_none=True))
        else:
            raise bad(f"a {item.role} message holds input parts, not {part.type}", param)
    return {"role": item.role, "content": parts}


def _chat_request(
    body: ResponsesRequest, messages: list[dict], tools: list[ResponseFunctionTool]
) -> dict:
    """The chat request this Responses request is (its fields by chat's names)."""
    logprobs = bool(body.include) or body.top_logprobs is not None
    chat: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "repetition_penalty": body.repetition_penalty,
        "seed": body.seed,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "max_completion_tokens": body.max_output_tokens,
        "user": body.prompt_cache_key or body.user,
        "logprobs": logprobs or None,
        "top_logprobs": body.top_logprobs if logprobs else None,
    }
    fmt = body.text.format if body.text is not None else None
    if fmt is not None and fmt.type != "text":
        if fmt.type == "json_schema":
            if fmt.name is None or fmt.json_schema is None:
                raise bad("a json_schema format needs its name and schema", "text.format")
            schema = fmt.model_dump(exclude_none=True, by_alias=True, exclude={"type"})
            chat["response_format"] = {"type": "json_schema", "json_schema": schema}
        else:
            chat["response_format"] = {"type": fmt.type}
    if tools:
        chat["tools"] = [
            {"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
            for t in tools
        ]
    choice = body.tool_choice
    if choice is not None:
        named = not isinstance(choice, str)
        chat["tool_choice"] = (
            {"type": "function", "function": {"name": choice.name}} if named else choice  # type: ignore[union-attr]
        )
    chat["parallel_tool_calls"] = body.parallel_tool_calls
    return {k: v for k, v in chat.items() if v is not None}


def _function_tools(body: ResponsesRequest) -> list[ResponseFunctionTool]:
    tools = []
    for i, raw in enumerate(body.tools or ()):
        if raw.get("type") != "function":
            raise bad(
                f"tool type {raw.get('type')!r} is not served: only function tools (the hosted "
                "tools run on OpenAI's servers)",
                f"tools.{i}.type",
            )
        try:
            tools.append(ResponseFunctionTool.model_validate(raw))
        except ValidationError as exc:
            err = from_pydantic(exc)
            err.param = f"tools.{i}.{err.param}" if err.param else f"tools.{i}"
            raise err from None
    return tools


def _renamed(exc: OmniError, origins: list[str]) -> OmniError:
    """A chat check's 400, naming the Responses field it came from."""
    param = exc.param
    if param is None:
        return exc
    head, _, rest = param.partition(".")
    if head == "messages":
        index, _, tail = rest.partition(".")
        if index.isdigit() and int(index) < len(origins):
            exc.param = origins[int(index)] + (f".{tail}" if tail else "")
    elif head == "tools" and ".function." in param:
        exc.param = param.replace(".function.", ".", 1)
    else:
        exc.param = _CHAT_PARAMS.get(head, head) + (f".{rest}" if rest else "")
    return exc


# -- the reply ---------------------------------------------------------------------------------


class _Reply:
    """One response under way: its ids, its engine request and ticket, its output items as
    they are made, the Response object around them, and what is stored of it."""

    def __init__(
        self,
        conn: HTTPConnection,
        service: WorkerService,
        body: ResponsesRequest,
        tools: list[ResponseFunctionTool],
        turn: ChatTurn,
        prior: list[dict],
        given: list[BaseModel],
    ) -> None:
        self.conn, self.service, self.body, self.tools = conn, service, body, tools
        self.gen, self.ticket = turn.gens[0], turn.ticket
        self.calls = calls_of(conn, turn.tools, 1)[0]
        self.id = reply_id(conn, "resp")
        self.message_ids = reply_id(conn, "msg")
        self.call_item_ids = reply_id(conn, "fc")
        self.created = created(conn)
        self.logprobs = bool(body.include) or body.top_logprobs is not None
        self.prior = prior
        self.input = _normalized(given, reply_id(conn, "item"))
        self.output: list[dict] = []

    def message(self) -> dict:
        """A new (in progress) output message."""
        item = {
            "id": f"{self.message_ids}-{len(self.output)}",
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        self.output.append(item)
        return item

    def function_call(self, call: dict) -> dict:
        item = {
            "id": f"{self.call_item_ids}-{len(self.output)}",
            "type": "function_call",
            "status": "completed",
            "call_id": call["id"],
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"],
        }
        self.output.append(item)
        return item

    def final_status(self, finished: Finished) -> str:
        called = self.calls is not None and bool(self.calls.calls)
        return "incomplete" if finished.finish_reason == "length" and not called else "completed"

    def response(
        self, status: str, finished: Finished | None = None, error: dict | None = None
    ) -> dict:
        body = self.body
        fmt = body.text.format if body.text is not None and body.text.format else None
        choice = body.tool_choice or "auto"
        out: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": None,
            "model": body.model,
            "output": self.output,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "prompt_cache_key": body.prompt_cache_key,
            "reasoning": None,
            "safety_identifier": body.safety_identifier,
            "service_tier": "default",
            "store": body.store is not False,
            "temperature": body.temperature,
            "text": {
                "format": fmt.model_dump(exclude_none=True, by_alias=True)
                if fmt
                else {"type": "text"}
            },
            "tool_choice": choice.model_dump() if isinstance(choice, BaseModel) else choice,
            "tools": [t.model_dump(exclude_none=True) for t in self.tools],
            "top_logprobs": body.top_logprobs,
            "top_p": body.top_p,
            "truncation": "disabled",
            "usage": None,
            "user": body.user,
            "metadata": body.metadata or {},
        }
        if status == "incomplete":
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        if finished is not None:
            cached = finished.cached_tokens
            out["usage"] = {
                "input_tokens": finished.prompt_tokens,
                # (the prefix cache keeps every prompt token it did not already hold)
                "input_tokens_details": {
                    "cached_tokens": cached,
                    "cache_write_tokens": finished.prompt_tokens - cached,
                },
                "output_tokens": finished.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": finished.prompt_tokens + finished.completion_tokens,
            }
        return out

    async def store(self, response: dict) -> None:
        """Kept for ``previous_response_id`` (unless ``store: false``), before the client has
        the end of the response: a client that continues at once finds it."""
        if self.body.store is False:
            return
        stored = StoredResponse(response, self.input, self.prior)
        try:
            await self.service.responses.put(stored, _owner(self.conn))
        except (redis.exceptions.RedisError, OSError) as exc:
            # the answer stands; only a later previous_response_id to it fails (as unknown)
            log.warning("response %s not stored: %s", self.id, exc)


def _text_part(text: str = "", logprobs: list[dict] | None = None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


async def _begin(conn: HTTPConnection, service: WorkerService, body: ResponsesRequest) -> _Reply:
    """Every check of a request, its conversation read back, then its admission: the response
    is under way (its ticket held: the caller releases it)."""
    service.check_serves(body.model, Endpoint.RESPONSES)
    _refuse_unserved(body)
    tools = _function_tools(body)
    prior: list[dict] = []
    if body.previous_response_id is not None:
        earlier = await _stored(service, body.previous_response_id, _owner(conn))
        if earlier is None:
            raise OmniError(
                404,
                ErrorCode.NOT_FOUND,
                f"no stored response has the id {body.previous_response_id!r} (unknown, "
                "deleted, expired, or made with store: false)",
                "previous_response_id",
            )
        prior = earlier.conversation()
    raw = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    given = _items(raw, "input")
    items = _items(prior, "previous_response_id") + given
    origins = ["previous_response_id"] * len(prior) + [f"input.{k}" for k in range(len(given))]
    messages, where = _chat_messages(items, origins)
    if body.instructions:
        messages.insert(0, {"role": "system", "content": body.instructions})
        where.insert(0, "instructions")
    if not messages:
        raise bad("the input holds no item", "input")
    try:
        chat = ChatRequest.model_validate(_chat_request(body, messages, tools))
        turn = await admitted_chat(conn, service, chat)
    except ValidationError as exc:
        raise _renamed(from_pydantic(exc), where) from None
    except OmniError as exc:
        raise _renamed(exc, where) from None
    try:
        return _Reply(conn, service, body, tools, turn, prior, given)
    except BaseException:
        turn.ticket.release()
        raise


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    service = service_of(request)
    body = await read_json(request, ResponsesRequest)
    reply = await _begin(request, service, body)
    if body.stream:
        return event_stream(_sse(_events(reply)), reply.ticket)
    results = await collect_all(request, service, [reply.gen], reply.ticket)
    if results is None:
        return closed_response()
    result = results[0]
    finished = result.finished or Finished("stop")
    text = "".join(result.text)
    found: list[dict] = []
    calls = reply.calls
    if calls is not None:
        sent, found = calls.feed(text)
        rest, more = calls.finish()
        text, found = sent + rest, found + more
    status = reply.final_status(finished)
    if text or not found:
        message = reply.message()
        message["status"] = status
        message["content"] = [
            _text_part(text, logprobs_json(result.logprobs) if reply.logprobs else None)
        ]
    for call in found:
        reply.function_call(call)
    response = reply.response(status, finished)
    await reply.store(response)
    return Response(orjson.dumps(response), media_type="application/json")


async def _sse(events: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    async for event in events:
        kind = event["type"].encode()
        yield b"event: " + kind + b"\ndata: " + orjson.dumps(event) + b"\n\n"


async def _events(reply: _Reply) -> AsyncIterator[dict]:
    """The events of a streamed response, numbered as they go out: its text as the model writes
    it, a message per run of text, each function call whole once its block is complete."""
    sequence = 0
    open_message: dict | None = None  # the output message text is going into
    texts: list[str] = []
    logprobs: list[dict] = []

    def event(kind: str, **fields: Any) -> dict:
        nonlocal sequence
        sequence += 1
        return {"type": kind, **fields, "sequence_number": sequence - 1}

    def opened() -> list[dict]:
        nonlocal open_message, texts, logprobs
        open_message, texts, logprobs = reply.message(), [], []
        index = len(reply.output) - 1
        return [
            event("response.output_item.added", output_index=index, item=_copy(open_message)),
            event(
                "response.content_part.added",
                item_id=open_message["id"],
                output_index=index,
                content_index=0,
                part=_text_part(),
            ),
        ]

    def text(delta: str, entries: list[TokenLogprob] | None) -> list[dict]:
        out = opened() if open_message is None else []
        assert open_message is not None
        shown = logprobs_json(entries or []) if reply.logprobs else []
        texts.append(delta)
        logprobs.extend(shown)
        out.append(
            event(
                "response.output_text.delta",
                item_id=open_message["id"],
                output_index=len(reply.output) - 1,
                content_index=0,
                delta=delta,
                logprobs=shown,
            )
        )
        return out

    def closed(status: str) -> list[dict]:
        nonlocal open_message
        if open_message is None:
            return []
        item, open_message = open_message, None
        index = reply.output.index(item)
        part = _text_part("".join(texts), logprobs)
        item["content"], item["status"] = [part], status
        ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            event("response.output_text.done", **ids, text=part["text"], logprobs=part["logprobs"]),
            event("response.content_part.done", **ids, part=part),
            event("response.output_item.done", output_index=index, item=item),
        ]

    def called(call: dict) -> list[dict]:
        out = closed("completed")
        item = reply.function_call(call)
        index = len(reply.output) - 1
        added = {**item, "arguments": "", "status": "in_progress"}
        ids = {"item_id": item["id"], "output_index": index}
        return [
            *out,
            event("response.output_item.added", output_index=index, item=added),
            event("response.function_call_arguments.delta", **ids, delta=item["arguments"]),
            event(
                "response.function_call_arguments.done",
                **ids,
                name=item["name"],
                arguments=item["arguments"],
            ),
            event("response.output_item.done", output_index=index, item=item),
        ]

    finished = Finished("stop")
    calls = reply.calls
    yield event("response.created", response=reply.response("in_progress"))
    yield event("response.in_progress", response=reply.response("in_progress"))
    try:
        async with merged_events(reply.service, [reply.gen]) as stream:
            async for _, ev in stream:
                if isinstance(ev, TextDelta):
                    reply.ticket.text()
                    if calls is None:
                        for out in text(ev.text, ev.logprobs):
                            yield out
                        continue
                    sent, found = calls.feed(ev.text)
                    for out in text(sent, None) if sent else ():
                        yield out
                    for call in found:
                        for out in called(call):
                            yield out
                elif isinstance(ev, Finished):
                    finished = ev
        reply.service.metrics.tokens_out.inc(finished.completion_tokens)
        if calls is not None:
            rest, more = calls.finish()
            for out in text(rest, None) if rest else ():
                yield out
            for call in more:
                for out in called(call):
                    yield out
        status = reply.final_status(finished)
        if not reply.output:  # an empty reply is an empty message, as a whole response's
            for out in opened():
                yield out
        for out in closed(status):
            yield out
        response = reply.response(status, finished)
        await reply.store(response)
        yield event(f"response.{status}", response=response)
    except StageFailed as exc:
        _, code, message, param = stage_error(exc)
        yield event("error", code=code.value, message=message, param=param)
        failed = reply.response("failed", error={"code": "server_error", "message": message})
        yield event("response.failed", response=failed)


def _copy(item: dict) -> dict:
    return {**item, "content": list(item["content"])}


# -- WebSocket mode: one socket, one response.create after another ---------------------------


def _socket_exchange(websocket: WebSocket, n: int) -> HTTPConnection:
    """The ``n``-th response of a socket as a request of its own (``worker.api.replay``): its
    ids from the router's request id and ``n``, created now."""
    names = (REQUEST_ID_HEADER.encode(), CREATED_HEADER.encode())
    headers = [(k, v) for k, v in websocket.scope["headers"] if k not in names]
    rid = websocket.headers.get(REQUEST_ID_HEADER)
    if rid:
        headers.append((names[0], f"{rid}/{n}".encode()))
    headers.append((names[1], str(int(time.time())).encode()))
    return HTTPConnection({**websocket.scope, "headers": headers})


def _socket_error(error: dict, status: int, sequence: int | None = None) -> str:
    """An error as the Responses WebSocket sends it: the HTTP status and the error object."""
    event: dict[str, Any] = {"type": "error", "status": status, "error": error}
    if sequence is not None:
        event["sequence_number"] = sequence
    return orjson.dumps(event).decode()


@router.websocket("/v1/responses")
async def responses_socket(websocket: WebSocket) -> None:
    """OpenAI's WebSocket mode (the SDK's ``client.responses.connect()``, LiveKit's Responses
    LLM by default): ``response.create`` events (the fields of ``POST /v1/responses``; the
    stream is implicit), each answered by its response's events, one response at a time; a
    mistake is an ``error`` event and the socket stays open."""
    service: WorkerService = websocket.app.state.service
    token = service.settings.token
    if token is not None and not authorised(websocket, token.get_secret_value()):
        await websocket.close(POLICY_VIOLATION, "missing or wrong worker token")
        return
    model = websocket.query_params.get("model")
    if Endpoint.RESPONSES not in service.capabilities.endpoints or model not in (
        None,
        service.spec.name,
    ):
        await websocket.close(POLICY_VIOLATION, f"this worker serves no responses for {model!r}")
        return
    await websocket.accept()
    limit = getattr(websocket.app.state, "max_prompt_bytes", None)
    try:
        for n in itertools.count(1):
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            try:
                body = ResponsesRequest.model_validate(_create_event(message.get("text"), limit))
                reply = await _begin(_socket_exchange(websocket, n), service, body)
            except ValidationError as exc:
                await websocket.send_text(_socket_error(from_pydantic(exc).body()["error"], 400))
                continue
            except OmniError as exc:
                await websocket.send_text(_socket_error(exc.body()["error"], exc.status))
                continue
            try:
                async for event in _events(reply):
                    if event["type"] == "error":  # (the SSE form names no status)
                        error = {"type": "server_error", "code": event["code"],
                                 "message": event["message"], "param": event["param"]}  # fmt: skip
                        await websocket.send_text(
                            _socket_error(error, 503, event["sequence_number"])
                        )
                    else:
                        await websocket.send_text(orjson.dumps(event).decode())
            finally:
                reply.ticket.release()
    except (WebSocketDisconnect, RuntimeError):
        pass  # the client left


def _create_event(text: str | None, prompt_limit: int | None) -> dict:
    """A ``response.create`` event's body, as ``POST /v1/responses`` takes it."""
    doc = read_event(text)
    if doc.get("type") != "response.create":
        raise bad("the client's event is response.create", "type")
    del doc["type"]
    if "stream" in doc:
        raise bad("stream is implicit over the WebSocket: do not send it", "stream")
    if prompt_limit is not None:
        limits.check_prompt(doc, prompt_limit)
    return doc


# -- stored responses --------------------------------------------------------------------------


async def _stored(service: WorkerService, response_id: str, owner: str) -> StoredResponse | None:
    try:
        return await service.responses.get(response_id, owner)
    except (redis.exceptions.RedisError, OSError) as exc:
        raise OmniError(
            503, ErrorCode.WORKER_UNAVAILABLE, f"response store (Redis) is unreachable: {exc}"
        ) from exc


async def _stored_or_404(request: Request, response_id: str) -> StoredResponse:
    stored = await _stored(service_of(request), response_id, _owner(request))
    if stored is None:
        raise OmniError(
            404,
            ErrorCode.NOT_FOUND,
            f"no stored response has the id {response_id!r} (unknown, deleted or expired)",
            "response_id",
        )
    return stored


@router.get("/v1/responses/{response_id}")
async def retrieve_response(request: Request, response_id: str) -> Response:
    for name in request.query_params:  # (include, stream: a background response's)
        raise bad(f"query parameter {name!r} is not served here", name)
    stored = await _stored_or_404(request, response_id)
    return Response(orjson.dumps(stored.response), media_type="application/json")


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> Response:
    await _stored_or_404(request, response_id)
    await service_of(request).responses.delete(response_id, _owner(request))
    body = {"id": response_id, "object": "response", "deleted": True}
    return Response(orjson.dumps(body), media_type="application/json")


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(request: Request, response_id: str) -> Response:
    """The input items of one request (its own, not the conversation before it), newest first
    unless ``order=asc``, ``limit`` (1-100, 20) at a time after the item ``after``."""
    query = dict(request.query_params)
    for name in query:
        if name not in ("limit", "order", "after"):
            raise bad(f"query parameter {name!r} is not served here", name)
    limit = query.get("limit", "20")
    if not limit.isdigit() or not 1 <= int(limit) <= 100:
        raise bad("limit is a number from 1 to 100", "limit")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad("order is 'asc' or 'desc'", "order")
    stored = await _stored_or_404(request, response_id)
    items = stored.input if order == "asc" else stored.input[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise bad(f"no input item of this response has the id {after!r}", "after")
        items = items[ids.index(after) + 1 :]
    page = items[: int(limit)]
    body = {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > len(page),
    }
    return Response(orjson.dumps(body), media_type="application/json")
