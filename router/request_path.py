"""The request path: classify -> admit -> affinity/policy -> connect (with retries) -> relay,
for HTTP requests and WebSocket upgrades alike, and the end of every exchange (load released,
health and metrics recorded, a refused or reset request sent elsewhere). The common request (no
session key, an idle pooled connection) runs synchronously inside the client's
``data_received`` callback: no task, no Redis round trip."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import parse_qs

from fleet.api_keys import API_KEY_ID_HEADER, api_key_id
from fleet.errors import ErrorCode, OmniError
from fleet.records import Endpoint
from router.admission import Admission, Rejected
from router.affinity import Affinity
from router.auth import ClientAuth, credential
from router.classify import (
    ROUTE_LABEL,
    UNSERVED,
    WEBSOCKET_ONLY,
    Classified,
    StageClass,
    check_session_key,
    classify_json,
    classify_plain,
    route_of,
)
from router.dispatch import Dispatch, retry_backoff
from router.http.headers import read_client_headers
from router.http.proxy import BODY, LEFT_FLEET, WAITING, Resumed, Upstream, end_stream
from router.http.server import ClientConnection, ClientLimits, Request
from router.http.tunnel import GOING_AWAY, WORKER_LOST, Tunnel
from router.http.wire import error_response
from router.metrics import AffinityOutcome, CloseBy, FailoverOutcome, Metrics
from router.policies import CHOOSERS
from router.prefix import PrefixIndex
from router.probes import Prober
from router.resources import is_exhaustion
from router.settings import Policy, RouterSettings
from router.view import FleetView, WorkerState

log = logging.getLogger("omni.router")
_SWEEP_S = 0.25
_IDLE_SWEEP_EVERY = 4  # idle client connections are looked at every 4th sweep (1 s)
_NO_LENGTH_METHODS = frozenset({b"GET", b"HEAD", b"DELETE", b"OPTIONS"})
# generation requests: no side effect beyond the answer, so one that no worker answered may be
# sent again (voices are not: an upload may have been stored before the connection broke)
_RESENDABLE = frozenset(
    {
        Endpoint.CHAT,
        Endpoint.RESPONSES,  # (stored under the router's request id: a resend stores it again)
        Endpoint.COMPLETIONS,
        Endpoint.SPEECH,
        Endpoint.TRANSCRIPTION,
        Endpoint.TRANSLATION,
    }
)
_OWNED = frozenset({Endpoint.VOICES, Endpoint.RESPONSES})  # what an API key's id scopes
_WORKER_LOST_REASON = "worker connection lost; reconnect with the same session id to resume"
Conn = TypeVar("Conn")
AdminRoutes = Callable[[ClientConnection, Request, bytes], None]
GiveUp = Callable[[ClientConnection, OmniError], None]  # answers a request no worker took
Spawn = Callable[[Coroutine[Any, Any, None]], None]


class RequestPath:
    """The router's side of every client connection (router.http.server.Handler)."""

    def __init__(
        self,
        settings: RouterSettings,
        view: FleetView,
        metrics: Metrics,
        admission: Admission,
        affinity: Affinity,
        auth: ClientAuth,
        prober: Prober,
        admin_routes: AdminRoutes,
        spawn: Spawn,
        worker_token_line: bytes,
    ) -> None:
        self.settings = settings
        self.view = view
        self.metrics = metrics
        self.admission = admission
        self.affinity = affinity
        self.auth = auth
        self.prober = prober
        self.admin_routes = admin_routes
        self.spawn = spawn
        self.worker_token_line = worker_token_line
        self.limits = ClientLimits(
            settings.max_body_bytes,
            settings.max_url_bytes,
            settings.max_header_bytes,
            settings.max_pipelined,
        )
        self.choose = CHOOSERS[settings.policy]
        self.prefixes = PrefixIndex(
            view,
            settings.prefix_bound,
            settings.prefix_slack,
            settings.prefix_max_blocks,
            settings.static_prefix_cache_tokens,
        )
        self.cache_aware = settings.policy is Policy.CACHE_AWARE
        self.check_keys = auth.required  # read per request: a plain attribute
        self.forward_auth = not self.check_keys  # a checked key is the router's, not forwarded
        self.session_header = settings.session_header.encode()
        self.session_from_user = settings.session_from_user
        self.rid_prefix = os.urandom(4).hex().encode() + b"-"
        self.rid_counter = itertools.count(1)
        self.retry_after_line = b"retry-after: %d\r\n" % settings.retry_after_s
        # the lines every request carries to its worker after its id: the time the router took
        # it in (renewed by the sweep) and the worker token; one piece, so no cost per request
        self.stamp_lines = _created_line() + worker_token_line
        self.in_flight = 0
        self.ws_sessions = 0
        self.tunnels: dict[Tunnel, WorkerState] = {}  # open WebSocket sessions, by worker
        self.active: set[ClientConnection] = set()  # clients with an exchange under way
        self.clients: set[ClientConnection] = set()  # every open client connection
        self.max_clients = 1 << 30  # set from the descriptor budget when serving starts

    # -- client connections ------------------------------------------------------------------

    def connection_opened(self, client: ClientConnection) -> bytes | None:
        if len(self.clients) >= self.max_clients:
            # refused while descriptors are left for probes, Redis and worker connections
            self.metrics.connections_refused += 1
            return error_response(
                503,
                ErrorCode.TOO_MANY_CONNECTIONS,
                "the router is at its connection limit; retry shortly",
                keep_alive=False,
                extra=self.retry_after_line,
            )
        self.clients.add(client)
        return None

    def connection_closed(self, client: ClientConnection) -> None:
        self.clients.discard(client)

    # -- request path ----------------------------------------------------------------------

    def handle(self, client: ClientConnection, req: Request) -> None:
        url = req.url
        q = url.find(b"?")
        path = url if q < 0 else url[:q]
        route = route_of(path)
        if route is None:
            unserved = UNSERVED.get(path)
            if unserved is not None:
                client.route = "other"
                err = OmniError(404, ErrorCode.ENDPOINT_NOT_SERVED, unserved)
                self.fail(client, err)
                return
            client.route = "models" if path.startswith(b"/v1/models") else "admin"
            self.admin_routes(client, req, path)
            return
        endpoint, json_routed, methods = route
        client.route = ROUTE_LABEL[endpoint]  # a dict, not the enum's value property
        if req.method not in methods:
            self.fail(client, OmniError(405, ErrorCode.METHOD_NOT_ALLOWED, "method not allowed"))
            return
        fwd, auth, ctype, session = read_client_headers(
            req.headers, self.session_header, self.forward_auth
        )
        if self.check_keys:
            if not self.auth.accepts(auth):
                self.auth.refuse(client)
                return
            if endpoint in _OWNED:  # per-key voice quotas and owners, stored responses
                key = credential(auth)
                assert key is not None
                fwd += (API_KEY_ID_HEADER.encode(), b": ", api_key_id(key).encode(), b"\r\n")
        if path in WEBSOCKET_ONLY:
            self.fail(
                client, OmniError(400, ErrorCode.INVALID_REQUEST, "this endpoint is WebSocket only")
            )
            return
        if json_routed:
            try:  # (only uploads stream, so a JSON-routed body is always here)
                c = classify_json(
                    endpoint, req.body or b"", ctype, self.session_from_user, self.cache_aware
                )
            except OmniError as exc:
                self.fail(client, exc)
                return
        else:
            c = classify_plain(endpoint)
            if q >= 0:  # a body routing does not read: a query may name the model
                c.model = parse_qs(url[q + 1 :].decode("latin-1")).get("model", [None])[0]
        admitted = self._admit(client, c, session)
        if admitted is None:
            return
        capable, open_ = admitted
        self.in_flight += 1
        body = req.body
        rid_line = self._rid_line()
        if body is None:  # a streamed upload: its body follows, framed as the client framed it
            body = b""
            length = client.upload_length
            fwd.append(
                b"transfer-encoding: chunked\r\n"
                if length is None
                else b"content-length: " + length + b"\r\n"
            )
        elif body or req.method not in _NO_LENGTH_METHODS:
            fwd.append(b"content-length: %d\r\n" % len(body))
        if c.session_key is not None:  # the worker learns the key the router routed on
            fwd += (b"x-omni-session: ", c.session_key.encode(), b"\r\n")
        fwd += (rid_line, self.stamp_lines, b"\r\n")
        d = Dispatch(
            c,
            req.method + b" " + url + b" HTTP/1.1\r\n",
            b"".join(fwd),
            body,
            rid_line,
            req.body is not None,  # not a streamed upload: the router holds it whole
        )
        if c.session_key is None:
            self.metrics.affinity["none"] += 1
            if c.blocks and self.view.prefix_cache_tokens:
                worker, outcome = self.prefixes.place(c, capable, open_)
                self.metrics.prefix[client.route][outcome] += 1  # (a policy outcome too)
            else:
                worker = self.choose(open_, c.stage_class, None)
                self.metrics.policy["chosen"] += 1
            self._send(client, worker, d)
        else:
            self.spawn(self._dispatch_session(client, d, capable, open_))

    def _admit(
        self, client: ClientConnection, c: Classified, session: bytes | None
    ) -> tuple[list[WorkerState], list[WorkerState]] | None:
        """(capable, with capacity) workers, or None once the client has its error response."""
        try:
            if session is not None:
                c.session_key = check_session_key(session.decode("latin-1"))
            return self.admission.admit(c, self.in_flight)
        except Rejected as exc:
            self.metrics.policy[exc.outcome.value] += 1
            self.fail(client, exc)
            return None
        except OmniError as exc:  # a malformed session key
            self.fail(client, exc)
            return None

    def _rid_line(self) -> bytes:
        return b"x-omni-request-id: %b%x\r\n" % (self.rid_prefix, next(self.rid_counter))

    async def _dispatch_session(
        self,
        client: ClientConnection,
        d: Dispatch,
        capable: list[WorkerState],
        open_: list[WorkerState],
    ) -> None:
        worker = await self._session_worker(d, capable, open_)
        if client.closed:
            self.in_flight -= 1
            return
        self._send(client, worker, d)

    async def _session_worker(
        self, d: Dispatch, capable: list[WorkerState], open_: list[WorkerState]
    ) -> WorkerState:
        """The worker for a request or WebSocket with a session key (Redis affinity). A new
        session's binding is undone if its worker refuses the request (``d.bind_key``)."""
        c = d.c
        worker, outcome = await self.affinity.resolve(
            c.session_key,  # type: ignore[arg-type]
            capable,
            open_,
            self.choose,
            c.stage_class,
        )
        self.metrics.affinity[outcome.value] += 1
        self.metrics.policy["affinity" if outcome is AffinityOutcome.HIT else "chosen"] += 1
        if outcome is AffinityOutcome.NEW:
            d.bind_key = c.session_key
        if c.blocks and self.view.prefix_cache_tokens:
            # the binding decides, but the worker now holds the prompt for stateless requests
            self.prefixes.record(worker, c.blocks)
        return worker

    def _send(self, client: ClientConnection, worker: WorkerState, d: Dispatch) -> None:
        conn = worker.pool.take()  # type: ignore[union-attr]
        if conn is None:
            self.spawn(self._connect_and_send(client, worker, d))
        else:
            self._attach(client, worker, conn, d)

    def _attach(
        self, client: ClientConnection, worker: WorkerState, conn: Upstream, d: Dispatch
    ) -> None:
        worker.in_flight += 1
        worker.requests += 1
        client.worker = worker
        client.upstream = conn
        client.dispatch = d
        client.extra_headers = d.rid_line + worker.id_line
        conn.send(client, d.reqline + worker.host_line + d.head_tail + d.body)
        if client.uploading or client.upload_ended:
            client.upload_attached(conn)
        if client.paused:
            conn.pause_reading()
        self.active.add(client)

    async def _connect_and_send(
        self, client: ClientConnection, worker: WorkerState, d: Dispatch
    ) -> None:
        connected = await self._connect(client, worker, d, _open_upstream)
        if connected is None:
            return
        worker, conn = connected
        if client.closed:
            worker.pool.put(conn)  # type: ignore[union-attr]
            self.in_flight -= 1
            return
        self._attach(client, worker, conn, d)

    async def _connect(
        self,
        client: ClientConnection,
        worker: WorkerState,
        d: Dispatch,
        open_conn: Callable[[WorkerState, float], Awaitable[Conn]],
        give_up: GiveUp | None = None,
    ) -> tuple[WorkerState, Conn] | None:
        """A connection for ``d`` from ``open_conn``: to ``worker``, or after a failure to
        connect (nothing of the request was sent) to the next worker, within the request's
        deadline and ``max_attempts``. None once the client has its answer (``give_up``: by
        default an error response) or is gone. The one connect-with-retry of requests,
        WebSocket upgrades and stream replays."""
        s = self.settings
        if not d.deadline:
            d.deadline = time.monotonic() + s.request_deadline_s
        answer = give_up or self._refuse
        while True:
            timeout = min(s.connect_timeout_s, max(0.001, d.deadline - time.monotonic()))
            try:
                return worker, await open_conn(worker, timeout)
            except (OSError, TimeoutError) as exc:
                nxt = await self._after_connect_failure(client, worker, d, exc, answer)
                if nxt is None:
                    return None
                worker = nxt

    def _refuse(self, client: ClientConnection, err: OmniError) -> None:
        self.fail(client, err, retry_after=True)

    async def _after_connect_failure(
        self,
        client: ClientConnection,
        worker: WorkerState,
        d: Dispatch,
        exc: BaseException,
        give_up: GiveUp,
    ) -> WorkerState | None:
        """Connecting to ``worker`` failed, so nothing of the request was sent: the next worker
        to try, after a jittered backoff; None once the client has its answer (or is gone)."""
        if is_exhaustion(exc):  # the router's own fault: no worker is to blame
            self._exhausted(client, exc, give_up)
            return None
        s = self.settings
        self._transport_failure(worker, f"connect: {type(exc).__name__}: {exc}")
        d.tried.add(worker.id)
        d.attempt += 1
        nxt = self._retry_target(d)
        backoff = retry_backoff(s.retry_backoff_s, d.attempt)
        if nxt is None or d.attempt >= s.max_attempts or time.monotonic() + backoff >= d.deadline:
            self.in_flight -= 1
            message = f"could not connect to a worker ({d.attempt} tried)"
            give_up(client, OmniError(503, ErrorCode.WORKER_UNAVAILABLE, message))
            return None
        self.metrics.policy["retried"] += 1
        await asyncio.sleep(backoff)
        if client.closed:
            self.in_flight -= 1
            return None
        return nxt

    def _exhausted(self, client: ClientConnection, exc: BaseException, give_up: GiveUp) -> None:
        """The router could not open a worker connection for want of its own resources."""
        self.in_flight -= 1
        self.metrics.resource_errors += 1
        log.warning("router out of resources, request refused: %s", exc)
        give_up(
            client,
            OmniError(
                503, ErrorCode.ROUTER_EXHAUSTED, "the router is out of connections; retry shortly"
            ),
        )

    def _retry_target(self, d: Dispatch) -> WorkerState | None:
        try:
            _, open_ = self.admission.admit(d.c, 0)
        except Rejected:
            return None
        rest = [w for w in open_ if w.id not in d.tried]
        if not rest:
            return None
        nxt = self.choose(rest, d.c.stage_class, d.c.session_key)
        if d.c.blocks and self.view.prefix_cache_tokens:  # computed (and cached) there now
            self.prefixes.record(nxt, d.c.blocks)
        return nxt

    # called from ClientConnection when the relay ends
    def exchange_done(
        self, client: ClientConnection, conn: Upstream, status: int, interrupted: str | None
    ) -> None:
        worker = client.worker
        self.in_flight -= 1
        self.active.discard(client)
        if worker is not None:
            worker.in_flight -= 1
            health = worker.health
            if interrupted is not None:
                worker.errors += 1
                self.metrics.error(client.route, ErrorCode.STREAM_INTERRUPTED)
                log.warning("stream from worker %s interrupted: %s", worker.id, interrupted)
                self._transport_failure(worker, interrupted)
            elif status >= 500 and status != 503:
                worker.errors += 1
                self._worker_failure(worker, f"HTTP {status}")
            elif health.consecutive_failures:
                health.request_succeeded()
        elapsed = time.monotonic() - client.started
        if worker is not None:
            worker.latency += 0.2 * (elapsed - worker.latency)
            if status >= 400:
                d = client.dispatch
                if d is not None and d.bind_key is not None:
                    self.spawn(self.affinity.unbind(d.bind_key, worker.id))
        self.metrics.request(client.route, status, elapsed)
        if conn.first_body_at:
            model = worker.record.model if worker is not None else "-"
            self.metrics.first_byte(client.route, model, conn.first_body_at - client.started)
        client.finish()

    def exchange_failed(self, client: ClientConnection, conn: Upstream, reason: str) -> None:
        """The request was sent but no response head came back: never retried."""
        worker = client.worker
        self.in_flight -= 1
        self.active.discard(client)
        if worker is not None:
            worker.in_flight -= 1
            worker.errors += 1
            self._transport_failure(worker, reason)
        if reason.startswith("timeout"):
            err = OmniError(504, ErrorCode.WORKER_TIMEOUT, reason)
        else:
            err = OmniError(502, ErrorCode.WORKER_UNAVAILABLE, f"worker failed: {reason}")
        client.upstream = None
        self.fail(client, err, extra=client.extra_headers)

    def exchange_refused(self, client: ClientConnection, conn: Upstream, code: bytes) -> None:
        """The worker answered 503 ``draining`` or ``overloaded``: it refused the request before
        doing anything (it began draining after it was chosen, or a stage the request needs is
        full), so the request goes to another worker; with none left, the client gets 503
        ``draining`` or, as when the router finds every worker full, 429 ``overloaded``."""
        if code == b"draining":
            err = OmniError(503, ErrorCode.DRAINING, "every eligible worker is draining")
        else:
            err = OmniError(429, ErrorCode.OVERLOADED, "every eligible worker is full")
        self._resend_elsewhere(client, err)

    def exchange_reset(self, client: ClientConnection, conn: Upstream) -> None:
        """The worker closed or reset the connection before sending a single response byte
        (killed mid-request, or a pooled connection it closed as the request went out). A
        generation request that the router holds whole goes to another worker; anything
        else (a voice upload above all: the voice may be stored) fails as sent."""
        d = client.dispatch
        reason = "worker closed the connection before answering"
        if (
            d is None
            or d.c.endpoint not in _RESENDABLE
            or not (d.retryable or client.rewind_upload())  # a transcription's kept upload
        ):
            self.exchange_failed(client, conn, reason)
            return
        worker = client.worker
        if worker is not None:
            worker.errors += 1
            self._transport_failure(worker, reason)
        self._resend_elsewhere(
            client, OmniError(502, ErrorCode.WORKER_UNAVAILABLE, f"worker failed: {reason}")
        )

    def _resend_elsewhere(self, client: ClientConnection, err: OmniError) -> None:
        """Send the client's current request, unanswered by its worker, to another one; or
        answer ``err`` when no other worker (or attempt) is left."""
        worker = client.worker
        d: Dispatch = client.dispatch  # type: ignore[assignment]
        self.active.discard(client)
        client.upstream = None
        if worker is not None:
            worker.in_flight -= 1
            d.tried.add(worker.id)
        d.attempt += 1
        nxt = self._retry_target(d) if d.attempt < self.settings.max_attempts else None
        if nxt is None:
            self.in_flight -= 1
            self.fail(client, err, retry_after=err.status == 503, extra=client.extra_headers)
            return
        self.metrics.policy["retried"] += 1
        self._send(client, nxt, d)

    def exchange_broke(self, client: ClientConnection, conn: Upstream, reason: str) -> bool:
        """A stream broke after part of it was relayed (its worker died, hung or left the
        fleet). True: the request goes to another worker, and the client's stream continues
        from that worker's replay (``Resumed``: it is the same stream because a reply is a
        function of the request, worker.api.replay). False: the caller ends the stream with
        the terminal error, as before."""
        d = client.dispatch
        worker = client.worker
        outcome = self._not_resumable(client, conn)
        nxt = None
        if outcome is None and d is not None:
            if worker is not None:
                d.tried.add(worker.id)
            nxt = self._retry_target(d)
        if nxt is None or d is None:
            self.metrics.failover(client.route, outcome or FailoverOutcome.NO_WORKER)
            return False
        # the broken worker's part is over (as exchange_done ends an interrupted stream)
        self.active.discard(client)
        client.upstream = None
        client.worker = None
        if worker is not None:
            worker.in_flight -= 1
            worker.errors += 1
            log.warning(
                "stream from worker %s broke (%s): resuming on %s", worker.id, reason, nxt.id
            )
            self._transport_failure(worker, reason)
            if d.c.session_key is not None:  # the session follows its stream
                self.spawn(self.affinity.follow(d.c.session_key, worker.id, nxt.id))
        d.failovers += 1
        self.spawn(self._fail_over(client, nxt, d, conn))
        return True

    def _not_resumable(self, client: ClientConnection, conn: Upstream) -> FailoverOutcome | None:
        """Why the broken stream on ``conn`` cannot go on elsewhere (None: it can)."""
        d = client.dispatch
        s = self.settings
        if conn.diverged:
            return FailoverOutcome.DIVERGED
        if d is None or d.c.endpoint not in _RESENDABLE:
            return FailoverOutcome.NOT_REPLAYABLE
        if d.failovers >= s.max_stream_failovers:
            return FailoverOutcome.LIMIT
        if time.monotonic() - client.started > s.stream_failover_max_age_s:
            return FailoverOutcome.TOO_OLD
        if not (d.retryable or client.rewind_upload()):  # a transcription's upload, kept
            return FailoverOutcome.NOT_REPLAYABLE
        return None

    async def _fail_over(
        self, client: ClientConnection, worker: WorkerState, d: Dispatch, broken: Upstream
    ) -> None:
        """Send ``d`` again, to ``worker`` or after a failure to connect to the next one; the
        new connection's relay resumes the client's stream where ``broken`` left it."""
        sent, sse = broken.sent, broken.sse
        tail = broken.last_piece if sent else b""

        async def open_replay(w: WorkerState, timeout: float) -> Resumed:
            assert w.pool is not None
            conn = await w.pool.connect(lambda p: Resumed(p, sent, tail, sse), timeout)
            return conn  # type: ignore[return-value]

        def end(client: ClientConnection, err: OmniError) -> None:
            self.metrics.failover(client.route, FailoverOutcome.NO_WORKER)
            self.metrics.error(client.route, ErrorCode.STREAM_INTERRUPTED)
            if not client.closed:
                end_stream(client.transport, sse, tail or b"\n\n", err.message)
            self.metrics.request(client.route, 200, time.monotonic() - client.started)
            client.finish()

        d.deadline, d.attempt = 0.0, 0  # a fresh connect budget for the replay
        connected = await self._connect(client, worker, d, open_replay, end)
        if connected is None:
            return
        worker, conn = connected
        if client.closed:  # the client went away while the replay was on its way
            conn.close()
            self.exchange_aborted(client)
        else:
            self._attach(client, worker, conn, d)

    def stream_resumed(self, client: ClientConnection, conn: Resumed) -> None:
        """A replay caught up with what the client had: the stream goes on."""
        self.metrics.failover(client.route, FailoverOutcome.RESUMED)
        self.metrics.replayed_bytes += conn.had
        worker = client.worker
        log.info("stream resumed on worker %s after %d bytes", worker and worker.id, conn.had)

    def exchange_aborted(self, client: ClientConnection) -> None:
        """The client went away mid-exchange."""
        worker = client.worker
        self.in_flight -= 1
        self.active.discard(client)
        if worker is not None:
            worker.in_flight -= 1
        self.metrics.request(client.route, 499, time.monotonic() - client.started)
        client.finish()

    def _transport_failure(self, worker: WorkerState, reason: str) -> None:
        self._worker_failure(worker, reason)
        self.prober.probe_soon(worker)

    def _worker_failure(self, worker: WorkerState, reason: str) -> None:
        before = worker.health.breaker
        worker.health.request_failed(reason)
        if worker.health.breaker is not before:
            self.view.version += 1
            log.warning("circuit of worker %s opened: %s", worker.id, reason)

    # -- responses made by the router ------------------------------------------------------

    def fail(
        self,
        client: ClientConnection,
        err: OmniError,
        retry_after: bool = False,
        extra: bytes = b"",
    ) -> None:
        self.metrics.error(client.route, err.code)
        if retry_after or err.status == 429:
            extra += self.retry_after_line
        data = error_response(
            err.status, err.code, err.message, client.keep_alive, extra, err.param
        )
        client.respond(data, err.status)

    # -- WebSocket ---------------------------------------------------------------------------

    def start_websocket(self, client: ClientConnection, req: Request) -> None:
        client.started = time.monotonic()
        client.keep_alive = False
        url = req.url
        path, _, query = url.partition(b"?")
        route = route_of(path)
        client.route = route[0].value if route else "other"
        fwd, auth, _, session = read_client_headers(
            req.headers, self.session_header, self.forward_auth
        )
        if self.check_keys and not self.auth.accepts(auth):
            self.auth.refuse(client)
            return
        if route is None:
            self.fail(client, OmniError(404, ErrorCode.NOT_FOUND, "no WebSocket endpoint here"))
            return
        params = parse_qs(query.decode("latin-1"))
        if session is None and "session_id" in params:  # a browser cannot set headers
            session = params["session_id"][0].encode("latin-1")
        # any worker that serves the endpoint (and the model asked for) takes the session; a
        # transcription session (OpenAI's ?intent=transcription) any worker that transcribes
        if params.get("intent") == ["transcription"] and route[0] is Endpoint.REALTIME:
            c = classify_plain(Endpoint.TRANSCRIPTION)
        else:
            c = classify_plain(route[0])
            c.stage_class = StageClass.SPEECH
        c.model = params.get("model", [None])[0]
        admitted = self._admit(client, c, session)
        if admitted is None:
            return
        capable, open_ = admitted
        self.in_flight += 1
        rid_line = self._rid_line()
        fwd += (b"connection: Upgrade\r\nupgrade: websocket\r\n", rid_line, self.worker_token_line)
        if c.session_key is not None:
            fwd += (b"x-omni-session: ", c.session_key.encode(), b"\r\n")
        if self.check_keys:  # a session's stored conversation belongs to its API key
            assert auth is not None
            key = credential(auth)
            assert key is not None
            fwd += (API_KEY_ID_HEADER.encode(), b": ", api_key_id(key).encode())
            fwd.append(b"\r\n")
        fwd.append(b"\r\n")
        d = Dispatch(c, req.method + b" " + url + b" HTTP/1.1\r\n", b"".join(fwd), b"", rid_line)
        self.spawn(self._websocket(client, d, capable, open_))

    async def _websocket(
        self,
        client: ClientConnection,
        d: Dispatch,
        capable: list[WorkerState],
        open_: list[WorkerState],
    ) -> None:
        c = d.c
        if c.session_key is not None:
            worker = await self._session_worker(d, capable, open_)
        else:
            worker = self.choose(open_, c.stage_class, None)
            self.metrics.affinity[AffinityOutcome.NONE.value] += 1
            self.metrics.policy["chosen"] += 1
        if client.closed:
            self.in_flight -= 1
            return
        loop = asyncio.get_running_loop()

        async def open_tunnel(w: WorkerState, timeout: float) -> Tunnel:
            tunnel = Tunnel(
                client.transport,
                d.rid_line + w.id_line,
                lambda t: self._tunnel_closed(client, w, t),
            )
            await asyncio.wait_for(loop.create_connection(lambda: tunnel, w.host, w.port), timeout)
            return tunnel

        bound = worker
        connected = await self._connect(client, worker, d, open_tunnel)
        if connected is None:
            return
        worker, tunnel = connected
        if c.session_key is not None and worker is not bound:
            self.spawn(self.affinity.follow(c.session_key, bound.id, worker.id))
        transport = tunnel.transport
        assert transport is not None
        # the session is the worker's load for its whole life, as a request is for its own
        worker.in_flight += 1
        worker.requests += 1
        worker.ws_sessions += 1
        self.ws_sessions += 1
        self.tunnels[tunnel] = worker
        if transport.is_closing():  # it closed before this task resumed: not a live session
            self._tunnel_closed(client, worker, tunnel)
            return
        pending = client.ws_pending or b""
        client.ws_pending = None
        client.tunnel = transport
        transport.write(d.reqline + worker.host_line + d.head_tail + bytes(pending))
        if client.closed:
            transport.close()

    def _tunnel_closed(self, client: ClientConnection, worker: WorkerState, tunnel: Tunnel) -> None:
        """A WebSocket tunnel to ``worker`` closed: its load is released (once), and the client
        learns why. The worker's own close frame went through untouched; a worker connection
        that ended without one (the worker died) gets the router's 1011 to the client."""
        if tunnel not in self.tunnels:
            return  # a connection given up before the upgrade went out: never counted
        del self.tunnels[tunnel]
        worker.in_flight -= 1
        worker.ws_sessions -= 1
        self.in_flight -= 1
        self.ws_sessions -= 1
        if not tunnel.status and not client.closed:  # no answer to the upgrade at all
            reason = "worker closed the connection before answering the WebSocket upgrade"
            worker.errors += 1
            self._transport_failure(worker, reason)
            self.fail(client, OmniError(502, ErrorCode.WORKER_UNAVAILABLE, reason))
            return
        self.metrics.request(client.route, tunnel.status or 499, time.monotonic() - client.started)
        frames = tunnel.frames
        if not tunnel.upgraded:
            pass  # the worker refused the upgrade: the client has its HTTP answer
        elif tunnel.router_code is not None:
            self.metrics.ws_closed(CloseBy.ROUTER, tunnel.router_code)
        elif frames.close_code is not None:
            self.metrics.ws_closed(CloseBy.WORKER, frames.close_code)
        elif client.closed:
            self.metrics.ws_closed(CloseBy.CLIENT, None)
        else:
            worker.errors += 1
            self._transport_failure(worker, "WebSocket: worker connection ended without a close")
            if tunnel.end_for_client(WORKER_LOST, _WORKER_LOST_REASON):
                self.metrics.ws_closed(CloseBy.ROUTER, WORKER_LOST)
            else:
                self.metrics.ws_closed(CloseBy.DROPPED, None)
        tunnel.client.close()

    def close_websockets(self) -> None:
        """The router stops: every session still open ends with 1001 (going away), on which
        clients reconnect (to another router) and resume their session."""
        for tunnel in list(self.tunnels):
            tunnel.end_for_client(GOING_AWAY, "router shutting down; reconnect to resume")
            if tunnel.transport is not None:
                tunnel.transport.close()

    async def sweep(self) -> None:
        """Headers and idle-between-chunks timeouts, checked for every exchange at once."""
        s = self.settings
        for tick in itertools.count():
            await asyncio.sleep(_SWEEP_S)
            now = time.monotonic()
            self.stamp_lines = _created_line() + self.worker_token_line
            self.affinity.log_summary(now)
            for client in list(self.active):
                conn = client.upstream
                if conn is None:
                    continue
                worker = client.worker
                if worker is not None and worker.gone:  # paused or cut off: it stopped beating
                    conn.abort(LEFT_FLEET)
                elif conn.state == WAITING and now - conn.sent_at > s.headers_timeout_s:
                    conn.abort(f"timeout: no response headers within {s.headers_timeout_s:g}s")
                elif conn.state == BODY and now - conn.last_activity > s.idle_timeout_s:
                    conn.abort(f"timeout: worker sent nothing for {s.idle_timeout_s:g}s")
            for tunnel, worker in list(self.tunnels.items()):
                if worker.gone and tunnel.transport is not None:
                    tunnel.transport.close()  # the client gets 1011 and resumes elsewhere
            # slow clients (slowloris): a request that stopped arriving, while we were reading;
            # idle ones: no request under way (never started, or kept alive after one)
            idle_too = tick % _IDLE_SWEEP_EVERY == 0
            for client in list(self.clients):
                if client.closed or client.tunnel is not None or client.ws_pending is not None:
                    continue
                if client.in_request:
                    if client.rx != client.rx_seen or not client.transport.is_reading():
                        client.rx_seen = client.rx
                        client.stall_at = now
                    elif now - client.stall_at > s.client_timeout_s:
                        client.stalled(s.client_timeout_s)
                elif idle_too and not client.busy:
                    if client.rx != client.rx_seen:  # finish() resets rx_seen: clock restarts
                        client.rx_seen = client.rx
                        client.stall_at = now
                    elif now - client.stall_at > s.client_idle_timeout_s:
                        client.idle_out()


def _created_line() -> bytes:
    """When the router takes a request in, sent with it: its reply's ``created`` on whichever
    worker serves it, a replay included (worker.api.replay)."""
    return b"x-omni-created: %d\r\n" % time.time()


async def _open_upstream(worker: WorkerState, timeout: float) -> Upstream:
    """An idle pooled connection to ``worker``, else a new one."""
    pool = worker.pool
    assert pool is not None  # every routable worker has one
    conn = pool.take()
    return conn if conn is not None else await pool.connect(Upstream, timeout)
