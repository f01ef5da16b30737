"""Prometheus metrics with fixed label vocabularies.

The request path only bumps plain ints in dicts (no locks, no label lookups); the exposition
is built at scrape time by a collector. Every label value comes from a fixed list below, so
the number of series never depends on traffic (no worker ids or paths as labels; the model only
on the scaling signal and the first-byte times, whose models are the fleet's specs, as the
workers' records name them, never a request's "model" field).
Each router process keeps its own counters; with ``--processes N`` scrape each process or sum.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from enum import StrEnum

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from fleet.errors import ErrorCode
from fleet.records import Endpoint, ScaleSignal

ROUTES = (*(e.value for e in Endpoint), "models", "admin", "other")
PREFIX_ROUTES = (Endpoint.CHAT.value, Endpoint.COMPLETIONS.value)  # prompts the policy places
STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")
# the class of every three-digit status, looked up per request (no arithmetic, no min/max)
_CLASS_OF = tuple(STATUS_CLASSES[min(max(s // 100, 1), 5) - 1] for s in range(1000))


class PolicyOutcome(StrEnum):
    CHOSEN = "chosen"  # a worker was picked by the policy
    PREFIX = "prefix"  # the worker holding the longest cached prefix of the prompt
    PREFIX_OVERLOADED = "prefix_overloaded"  # that worker was over the bound: the least loaded
    AFFINITY = "affinity"  # the session's bound worker was used
    RETRIED = "retried"  # connecting failed, another worker was tried
    NO_ELIGIBLE = "no_eligible"  # 503
    OVER_CAPACITY = "over_capacity"  # every eligible worker full: 429
    GLOBAL_LIMIT = "global_limit"  # router in-flight limit: 429


class PrefixOutcome(StrEnum):
    """How the cache-aware policy placed a text chat or completion (router.prefix)."""

    HIT = "hit"  # sent to the worker with the longest cached match
    OVERLOADED = "overloaded"  # that worker was over the bound: the fewest requests instead
    MISS = "miss"  # no worker that can take it holds its start: the fewest requests


class AffinityOutcome(StrEnum):
    NONE = "none"  # no session key
    NEW = "new"  # first request of a session: bound now
    HIT = "hit"  # bound worker used
    MOVED_INELIGIBLE = "moved_ineligible"  # bound worker gone, draining or unhealthy
    MOVED_BOUNDED_LOAD = "moved_bounded_load"  # bound worker above the load bound
    HASHED = "hashed"  # no Redis (static or unreachable): rendezvous hash of the key


class CloseBy(StrEnum):
    """Who ended a WebSocket session (the code label says which close code the client got)."""

    WORKER = "worker"  # the worker's close frame, relayed untouched
    ROUTER = "router"  # the router's close frame: the worker's connection ended without one
    CLIENT = "client"  # the client's connection ended first
    DROPPED = "dropped"  # the worker's connection ended mid-frame: no close frame could go out


class FailoverOutcome(StrEnum):
    """How a stream that broke after part of it was relayed ended up (docs/reliability.md)."""

    RESUMED = "resumed"  # another worker's replay caught up with the client: the stream goes on
    DIVERGED = "diverged"  # the replay was not the same stream: cut with the terminal error
    NO_WORKER = "no_worker"  # no other eligible worker could be reached
    LIMIT = "limit"  # the request used its failovers (max_stream_failovers)
    TOO_OLD = "too_old"  # the stream ran longer than stream_failover_max_age_s
    NOT_REPLAYABLE = "not_replayable"  # an upload not kept, an endpoint with side effects


# close codes with a label of their own (RFC 6455 section 7.4.1); "none": no close frame
CLOSE_CODES = ("1000", "1001", "1005", "1008", "1009", "1011", "1012", "1013", "other", "none")
_CLOSE_LABEL = {int(c): c for c in CLOSE_CODES[:-2]}

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self) -> None:
        self.requests = {(r, s): 0 for r in ROUTES for s in STATUS_CLASSES}
        self.errors = {(r, c.value): 0 for r in ROUTES for c in ErrorCode}
        self.policy = {o.value: 0 for o in PolicyOutcome}
        self.affinity = {o.value: 0 for o in AffinityOutcome}
        # cache-aware placements of text chats and completions, by route; each also counts as
        # a policy outcome (hit: prefix, overloaded: prefix_overloaded, miss: chosen), added
        # at scrape
        self.prefix = {r: dict.fromkeys(PrefixOutcome, 0) for r in PREFIX_ROUTES}
        self.hist = {r: [0] * (len(BUCKETS) + 1) for r in ROUTES}
        self.hist_sum = dict.fromkeys(ROUTES, 0.0)
        # a stream's first body bytes relayed to the client: its first token or audio chunk (a
        # whole reply's first byte comes with its last: its duration says it), per route and the
        # model of the worker that sent it (a TTS model's first audio is not an Omni thinker's);
        # a (route, model) pair's series starts at its first stream
        self.first_hist: dict[tuple[str, str], list[int]] = {}
        self.first_sum: dict[tuple[str, str], float] = {}
        self.ws_closes = {(b.value, c): 0 for b in CloseBy for c in CLOSE_CODES}
        self.failovers = {(r, o.value): 0 for r in ROUTES for o in FailoverOutcome}
        self.replayed_bytes = 0  # generated again by a failover's worker and dropped
        self.redis_reconnects = 0
        self.health_transitions = 0
        self.probes_failed = 0
        self.connections_refused = 0  # over the connection cap
        self.idle_closed = 0  # client connections closed for idling
        self.resource_errors = 0  # the router's own EMFILE/ENOBUFS: never blamed on a worker
        self.gauges: Callable[[], dict[str, float]] = dict
        # the scaling signal per model (router/scaling.py): the one family labelled by model,
        # whose values come from the fleet's specs (a handful), never from requests
        self.scale: Callable[[], list[ScaleSignal]] = list

    def policy_outcomes(self) -> dict[str, int]:
        """Every placement by its outcome, the cache-aware ones included."""
        out = dict(self.policy)
        placed = self.prefix_outcomes()
        out[PolicyOutcome.PREFIX.value] += placed[PrefixOutcome.HIT]
        out[PolicyOutcome.PREFIX_OVERLOADED.value] += placed[PrefixOutcome.OVERLOADED]
        out[PolicyOutcome.CHOSEN.value] += placed[PrefixOutcome.MISS]
        return out

    def prefix_outcomes(self) -> dict[PrefixOutcome, int]:
        """The cache-aware placements by outcome, every route together."""
        out = dict.fromkeys(PrefixOutcome, 0)
        for counts in self.prefix.values():
            for outcome, n in counts.items():
                out[outcome] += n
        return out

    def request(self, route: str, status: int, seconds: float) -> None:
        self.requests[route, _CLASS_OF[status] if 0 <= status < 1000 else "5xx"] += 1
        self.hist[route][bisect_left(BUCKETS, seconds)] += 1
        self.hist_sum[route] += seconds

    def first_byte(self, route: str, model: str, seconds: float) -> None:
        key = (route, model)
        counts = self.first_hist.get(key)
        if counts is None:
            counts = self.first_hist[key] = [0] * (len(BUCKETS) + 1)
            self.first_sum[key] = 0.0
        counts[bisect_left(BUCKETS, seconds)] += 1
        self.first_sum[key] += seconds

    def error(self, route: str, code: ErrorCode) -> None:
        self.errors[route, code.value] += 1

    def ws_closed(self, by: CloseBy, code: int | None) -> None:
        label = "none" if code is None else _CLOSE_LABEL.get(code, "other")
        self.ws_closes[by.value, label] += 1

    def failover(self, route: str, outcome: FailoverOutcome) -> None:
        self.failovers[route, outcome.value] += 1

    def render(self) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        return generate_latest(registry)


class _Collector:
    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.m
        c = CounterMetricFamily(
            "omni_router_requests", "Requests answered", labels=["route", "status_class"]
        )
        for (route, cls), n in m.requests.items():
            c.add_metric([route, cls], n)
        yield c
        c = CounterMetricFamily(
            "omni_router_errors", "Errors by stable error code", labels=["route", "code"]
        )
        for (route, code), n in m.errors.items():
            if n:
                c.add_metric([route, code], n)
        yield c
        c = CounterMetricFamily(
            "omni_router_policy_outcomes", "Worker selection outcomes", labels=["outcome"]
        )
        for outcome, n in m.policy_outcomes().items():
            c.add_metric([outcome], n)
        yield c
        c = CounterMetricFamily(
            "omni_router_affinity_outcomes", "Session affinity outcomes", labels=["outcome"]
        )
        for outcome, n in m.affinity.items():
            c.add_metric([outcome], n)
        yield c
        c = CounterMetricFamily(
            "omni_router_prefix_lookups",
            "Cache-aware placements: hit (the longest cached prefix's worker), overloaded (it "
            "was over the bound), miss (no worker held the prompt's start)",
            labels=["route", "outcome"],
        )
        for route, placed in m.prefix.items():
            for outcome, n in placed.items():
                if n:
                    c.add_metric([route, outcome.value], n)
        yield c
        c = CounterMetricFamily(
            "omni_router_websocket_closes",
            "WebSocket sessions ended, by who ended them and the close code the client got",
            labels=["by", "code"],
        )
        for (by, code), n in m.ws_closes.items():
            if n:
                c.add_metric([by, code], n)
        yield c
        c = CounterMetricFamily(
            "omni_router_stream_failovers",
            "Streams whose worker failed part way, by what became of them",
            labels=["route", "outcome"],
        )
        for (route, outcome), n in m.failovers.items():
            if n:
                c.add_metric([route, outcome], n)
        yield c
        c = CounterMetricFamily(
            "omni_router_stream_replayed_bytes",
            "Bytes a failover's worker generated again up to where the client's stream was",
        )
        c.add_metric([], m.replayed_bytes)
        yield c
        yield _histogram(
            "request_duration_seconds", "Time from the full request to the end of the response",
            ["route"], {(route,): (counts, m.hist_sum[route]) for route, counts in m.hist.items()},
        )  # fmt: skip
        yield _histogram(
            "first_byte_seconds",
            "Time from the full request to a stream's first body bytes relayed to the client "
            "(its first token or audio chunk), by the model of the worker that sent them",
            ["route", "model"], {key: (n, m.first_sum[key]) for key, n in m.first_hist.items()},
        )  # fmt: skip
        c = CounterMetricFamily("omni_router_redis_reconnects", "Redis reconnections")
        c.add_metric([], m.redis_reconnects)
        yield c
        c = CounterMetricFamily("omni_router_health_transitions", "Worker health changes")
        c.add_metric([], m.health_transitions)
        yield c
        for name, value, doc in (
            ("probes_failed", m.probes_failed, "Health probes that failed"),
            ("connections_refused", m.connections_refused, "Clients refused at the cap"),
            ("idle_connections_closed", m.idle_closed, "Client connections closed when idle"),
            ("resource_errors", m.resource_errors, "The router's own descriptor exhaustion"),
        ):
            c = CounterMetricFamily(f"omni_router_{name}", doc)
            c.add_metric([], value)
            yield c
        signals = m.scale()
        for name, doc in (
            ("desired_replicas", "Workers the model needs (the signal to scale on)"),
            ("ready_replicas", "Workers of the model ready to serve"),
            ("in_flight", "Requests the model's workers hold, queued and running"),
        ):
            g = GaugeMetricFamily(f"omni_router_scale_{name}", doc, labels=["model"])
            for signal in signals:
                g.add_metric([signal.model], getattr(signal, name))
            yield g
        for name, gauge in m.gauges().items():
            g = GaugeMetricFamily(f"omni_router_{name}", name.replace("_", " "))
            g.add_metric([], gauge)
            yield g


def _histogram(
    name: str, doc: str, labels: list[str], series: dict[tuple[str, ...], tuple[list[int], float]]
) -> HistogramMetricFamily:
    """Bucket counts (one per bound of BUCKETS, then +Inf) and sums, per label values."""
    h = HistogramMetricFamily(f"omni_router_{name}", doc, labels=labels)
    for values, (counts, total) in series.items():
        cumulative, acc = [], 0
        for bound, n in zip((*BUCKETS, float("inf")), counts, strict=True):
            acc += n
            cumulative.append((_le(bound), acc))
        h.add_metric(list(values), cumulative, total)
    return h


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)
