"""Helpers shared by the routes: strict body parsing, session keys, and tying a request's
generation to its client connection (a disconnect cancels it)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import orjson
from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.datastructures import FormData
from starlette.requests import ClientDisconnect, HTTPConnection
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from fleet.errors import ErrorCode, OmniError
from worker.api import limits
from worker.api.errors import CLIENT_CLOSED, from_pydantic
from worker.service import Ticket, WorkerService

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

SESSION_HEADERS = ("x-session-id", "x-omni-session")


def service_of(request: Request) -> WorkerService:
    return request.app.state.service


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


async def read_json(request: Request, model: type[M]) -> M:
    """JSON body -> ``model``: 415 for another content type, 400 ``invalid_json`` for bytes
    that are not JSON, 400 ``invalid_request`` naming the field for a wrong shape."""
    data = await read_json_object(request)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_pydantic(exc) from exc


async def read_json_object(request: Request) -> dict:
    """JSON body -> a dict (``read_json`` without the model)."""
    kind = media_type(request)
    if kind != "application/json" and not kind.endswith("+json"):
        raise OmniError(
            415,
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            f"expected Content-Type application/json, got {kind or 'none'!r}",
        )
    raw = await request.body()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise OmniError(400, ErrorCode.INVALID_JSON, f"body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise OmniError(400, ErrorCode.INVALID_REQUEST, "body must be a JSON object")
    limit = getattr(request.app.state, "max_prompt_bytes", None)
    if limit is not None:  # before validation, tokenizing and every other cost
        limits.check_prompt(data, limit)
    return data


def read_event(text: str | None) -> dict:
    """A WebSocket client event: a JSON object in a text frame (else a 400 naming ``type``)."""
    if text is None:
        raise OmniError(400, ErrorCode.INVALID_REQUEST, "events are JSON text frames", "type")
    try:
        event = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise OmniError(400, ErrorCode.INVALID_JSON, f"event is not valid JSON: {exc}") from None
    if not isinstance(event, dict):
        raise OmniError(400, ErrorCode.INVALID_REQUEST, "an event is a JSON object", "type")
    return event


async def read_form(request: Request) -> FormData:
    if media_type(request) != "multipart/form-data":
        raise OmniError(
            415,
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            "expected Content-Type multipart/form-data",
        )
    try:
        return await request.form(max_files=4, max_fields=32)
    except (OmniError, ClientDisconnect):
        raise
    except Exception as exc:  # malformed multipart
        raise OmniError(400, ErrorCode.INVALID_REQUEST, f"bad multipart body: {exc}") from exc


def session_of(request: HTTPConnection, fallback: str | None = None) -> str | None:
    for name in SESSION_HEADERS:
        if value := request.headers.get(name):
            return value
    return fallback


async def until_disconnect(request: Request, work: Awaitable[T]) -> T | None:
    """Await ``work`` unless the client disconnects first: then cancel it (the cancellation
    closes the engine iterator, which aborts the request in every stage) and return None."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if task in done:
        return task.result()
    service_of(request).metrics.aborted.inc()
    return None


class TrackedStream(StreamingResponse):
    """A streamed body whose ticket is released however the stream ends: completed, failed,
    or cut by a disconnect before or while it runs."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        ticket: Ticket,
        *,
        media_type: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self.ticket = ticket

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            closer = getattr(self.body_iterator, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()
            self.ticket.release()


def closed_response() -> Response:
    return Response(status_code=CLIENT_CLOSED)
