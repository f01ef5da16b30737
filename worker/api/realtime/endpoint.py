"""``/v1/realtime?model=...``: the WebSocket of the OpenAI Realtime API; with
``&intent=transcription``, its transcription session, on any worker that transcribes.

Refusals come as an ``error`` event and a close code, never a hang: a wrong worker token or
model (1008), a draining worker (1012: reconnect, the conversation resumes elsewhere), the
worker's session limit (1013: try again later). A session lasts at most
``--realtime-max-session-seconds`` (then ``session_expired``, 1008). Bad client events get an
``error`` event and the session goes on."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import time

import orjson
from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from fleet.api_keys import API_KEY_ID_HEADER
from fleet.conversations import ConversationStore, conversation_name
from fleet.errors import OmniError
from fleet.records import Endpoint, WorkerStatus
from worker.api.common import SESSION_HEADERS, new_id
from worker.api.gate import TOKEN_HEADER
from worker.api.realtime import events as ev
from worker.api.realtime.config import TRANSCRIPTION
from worker.api.realtime.dialect import wants_beta
from worker.api.realtime.errors import Close, Code, RealtimeError
from worker.api.realtime.metrics import RealtimeMetrics
from worker.api.realtime.response import SessionClosed
from worker.api.realtime.session import RealtimeSession
from worker.service import WorkerService

log = logging.getLogger(__name__)

router = APIRouter()

SESSION_ID = re.compile(r"[\x21-\x7e]{1,128}")  # the router's session keys: printable ASCII
SUBPROTOCOL = "realtime"  # what browser clients offer (beside their key)


class Connection:
    """An open session as the service sees it: counted, and closed by a drain."""

    def __init__(self, session: RealtimeSession) -> None:
        self.session = session
        self.session_id = session.session_id
        self.ending: asyncio.Future[tuple[RealtimeError, Close]] = (
            asyncio.get_running_loop().create_future()
        )
        self.ended = asyncio.Event()

    def end(self, error: RealtimeError, code: Close) -> None:
        if not self.ending.done():
            self.ending.set_result((error, code))

    async def close_for_restart(self) -> None:
        self.end(
            RealtimeError(
                Code.DRAINING,
                "this worker is shutting down; reconnect with the same session id to resume",
                status=503,
            ),
            Close.SERVICE_RESTART,
        )
        await self.ended.wait()


def authorised(websocket: WebSocket, token: str) -> bool:
    """The socket carries the worker token (its header, or a bearer token): the realtime and
    speech-stream endpoints check it before accepting."""
    given = websocket.headers.get(TOKEN_HEADER.decode())
    auth = websocket.headers.get("authorization", "")
    if given is None and auth[:7].lower() == "bearer ":
        given = auth[7:].strip()
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def _session_id(websocket: WebSocket) -> str:
    for name in SESSION_HEADERS:
        if value := websocket.headers.get(name):
            break
    else:
        value = websocket.query_params.get("session_id")
    if value is None:
        return new_id("sess").replace("-", "_")
    if not SESSION_ID.fullmatch(value):
        raise RealtimeError(
            Code.INVALID_SESSION_KEY,
            "a session id is 1..128 printable ASCII characters",
            "session_id",
        )
    return value


def _admit(websocket: WebSocket, service: WorkerService, beta: bool) -> tuple[str, str, bool]:
    """(model, session id, whether it is a transcription session) of a session this worker
    takes now, or a ``RealtimeError`` whose status picks the close code."""
    token = service.settings.token
    if token is not None and not authorised(websocket, token.get_secret_value()):
        raise RealtimeError(Code.INVALID_API_KEY, "missing or wrong worker token", status=401)
    intent = websocket.query_params.get("intent")
    if intent not in (None, TRANSCRIPTION):
        raise RealtimeError(
            Code.INVALID_REQUEST, f"intent is {TRANSCRIPTION!r} or not given", "intent"
        )
    transcription_only = intent == TRANSCRIPTION
    if transcription_only and beta:
        raise RealtimeError(
            Code.INVALID_REQUEST,
            "transcription sessions speak the GA protocol: connect without OpenAI-Beta",
            "intent",
        )
    needs = Endpoint.TRANSCRIPTION if transcription_only else Endpoint.REALTIME
    if needs not in service.capabilities.endpoints:
        what = "transcription" if transcription_only else "realtime"
        raise RealtimeError(
            Code.ENDPOINT_NOT_SERVED,
            f"model {service.spec.name!r} does not serve {what} sessions",
            status=404,
        )
    try:
        model = service.check_model(websocket.query_params.get("model") or service.spec.name)
    except OmniError as exc:
        raise RealtimeError.from_omni(exc) from exc
    session_id = _session_id(websocket)
    if service.status == WorkerStatus.DRAINING:
        raise RealtimeError(Code.DRAINING, "worker is draining; retry on another", status=503)
    if not service.serving:
        raise RealtimeError(Code.OVERLOADED, f"worker is {service.detail}", status=503)
    limit = service.settings.realtime_max_sessions
    if len(service.realtime) >= limit:
        raise RealtimeError(
            Code.TOO_MANY_SESSIONS,
            f"this worker holds its limit of {limit} realtime sessions; try again later",
            status=503,
        )
    return model, session_id, transcription_only


def _close_code(error: RealtimeError) -> Close:
    if error.code == Code.DRAINING:
        return Close.SERVICE_RESTART
    if error.status == 503:
        return Close.TRY_AGAIN_LATER
    return Close.POLICY


def _store(service: WorkerService) -> ConversationStore | None:
    if service.store is None:
        return None
    s = service.settings
    return ConversationStore(
        service.store.redis,
        s.fleet,
        max_items=s.realtime_max_items,
        ttl_ms=int(s.realtime_conversation_ttl * 1000),
    )


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket) -> None:
    service: WorkerService = websocket.app.state.service
    offered = websocket.scope.get("subprotocols") or []
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    beta = wants_beta(websocket.headers.get("openai-beta"))
    try:
        model, session_id, transcription_only = _admit(websocket, service, beta)
    except RealtimeError as exc:
        metrics = RealtimeMetrics(service.metrics)
        metrics.error(exc.code.value)
        metrics.closed(_close_code(exc))
        with contextlib.suppress(Exception):
            await websocket.send_text(
                orjson.dumps({"event_id": new_id("event"), **exc.event()}).decode()
            )
            await websocket.close(_close_code(exc), exc.code.value)
        return
    owner = websocket.headers.get(API_KEY_ID_HEADER, "")
    session = RealtimeSession(
        service,
        session_id,
        model,
        websocket.send_text,
        beta=beta,
        store=_store(service),
        stored_name=conversation_name(session_id, owner),
        transcription_only=transcription_only,
    )
    connection = Connection(session)
    service.open_realtime(connection)
    opened = time.monotonic()
    expiry = asyncio.get_running_loop().call_later(
        service.settings.realtime_max_session_seconds,
        connection.end,
        RealtimeError(Code.SESSION_EXPIRED, "the session reached its longest life"),
        Close.POLICY,
    )
    receiver: asyncio.Task | None = None
    try:
        await session.open()
        receiver = asyncio.create_task(_receive(websocket, session), name="realtime-receive")
        await asyncio.wait({receiver, connection.ending}, return_when=asyncio.FIRST_COMPLETED)
    except SessionClosed:
        pass
    finally:
        expiry.cancel()
        if receiver is not None:
            receiver.cancel()
            with contextlib.suppress(BaseException):
                await receiver
        await session.stop_response()
        code: Close | None = None
        if connection.ending.done():
            error, code = connection.ending.result()
            await session.send_error(error)
            with contextlib.suppress(Exception):
                await websocket.close(code, error.code.value)
        session.closed = True
        session.metrics.closed(code)
        log.info(
            "realtime session %s ended after %.1fs (%s)",
            session_id,
            time.monotonic() - opened,
            f"close {code.value}" if code is not None else "closed by the client",
        )
        service.close_realtime(connection)
        connection.ended.set()


async def _receive(websocket: WebSocket, session: RealtimeSession) -> None:
    while True:
        try:
            message = await websocket.receive()
        except (WebSocketDisconnect, RuntimeError):
            return
        if message["type"] == "websocket.disconnect":
            return
        raw = message.get("text")
        if raw is None:
            raw = message.get("bytes") or b""
        event: ev.ClientEvent | None = None
        try:
            event = ev.parse(raw)
            await session.handle(event)
        except RealtimeError as exc:
            await session.send_error(exc, event.event_id if event else ev.event_id_of(raw))
        except SessionClosed:
            return
        except Exception:
            log.exception("realtime event %s failed", event.type if event else "?")
            error = RealtimeError(Code.INTERNAL_ERROR, "internal error", status=500)
            await session.send_error(error, event.event_id if event else None)
