"""Prometheus metrics of one worker. Every label takes values from a fixed vocabulary
(endpoints, status classes, error codes, the spec's stage names, the one model it serves), so
cardinality is bounded."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from fleet.errors import ErrorCode
from fleet.records import WorkerStatus
from worker.contract.pipeline import RequestKind


class Route(StrEnum):
    CHAT = "chat"
    COMPLETIONS = "completions"
    SPEECH = "speech"
    TRANSCRIPTION = "transcription"
    VOICES = "voices"
    MODELS = "models"
    OTHER = "other"


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status < 600 else "other"


REQUEST_KINDS = tuple(kind.value for kind in RequestKind)
AUDIO_KINDS = ("chat", "speech")  # the request kinds whose replies may be audio
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# real-time factor: seconds to make a reply's audio / its seconds (below 1: faster than played)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1, 1.5, 2, 3, 5)


class WorkerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, stages: Iterable[str], model: str) -> None:
        self.registry = CollectorRegistry()
        self.stages = list(stages)
        # the spec's name on the latency and audio series: a fleet's dashboards that sum them over
        # workers keep each model apart (a TTS model's first audio is not an Omni thinker's)
        self.model = model
        r = self.registry
        self.requests = Counter(
            "omni_worker_requests", "HTTP requests by route and status class",
            ["route", "status"], registry=r,
        )  # fmt: skip
        self.errors = Counter(
            "omni_worker_errors", "error responses by stable code", ["code"], registry=r
        )
        self.duration = Histogram(
            "omni_worker_request_seconds", "request duration, to the last byte",
            ["route"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        # per model and request kind (chat, completion, speech, transcription): an operator's
        # latency target differs between a voice reply and a transcript
        self.ttft = Histogram(
            "omni_worker_first_token_seconds", "time to first text token",
            ["model", "kind"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.ttfa = Histogram(
            "omni_worker_first_audio_seconds", "time to first audio chunk",
            ["model", "kind"], buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        # per model and request kind (chat, speech): the kinds that make audio
        self.rtf = Histogram(
            "omni_worker_real_time_factor",
            "an audio reply's time from admission to its last chunk / its audio seconds",
            ["model", "kind"], buckets=_RTF_BUCKETS, registry=r,
        )  # fmt: skip
        self.audio_streams = Counter(
            "omni_worker_audio_replies", "replies that made audio", ["model", "kind"], registry=r
        )
        self.underruns = Counter(
            "omni_worker_audio_underruns",
            "audio replies that fell behind real time: a player started at the first chunk "
            "would have run out before a later one came",
            ["model", "kind"], registry=r,
        )  # fmt: skip
        self.in_flight = Gauge("omni_worker_in_flight", "requests being served", registry=r)
        self.aborted = Counter(
            "omni_worker_aborted", "requests cancelled by a client disconnect", registry=r
        )
        self.audio_out = Counter(
            "omni_worker_audio_out_seconds", "seconds of audio produced", registry=r
        )
        self.tokens_out = Counter(
            "omni_worker_completion_tokens", "completion tokens produced", registry=r
        )
        self.queue_depth = Gauge(
            "omni_worker_stage_queue_depth", "waiting + running requests per stage",
            ["stage"], registry=r,
        )  # fmt: skip
        self.busy = Gauge(
            "omni_worker_stage_busy", "busy fraction per stage", ["stage"], registry=r
        )
        self.status = Gauge(
            "omni_worker_status", "1 for the current status", ["status"], registry=r
        )
        self.redis_up = Gauge("omni_worker_redis_up", "1 when Redis answers", registry=r)
        # /v1/realtime; worker/api/realtime/metrics.py names the label vocabularies
        self.realtime_sessions = Gauge(
            "omni_worker_realtime_sessions", "open /v1/realtime WebSocket sessions", registry=r
        )
        self.realtime_errors = Counter(
            "omni_worker_realtime_errors", "realtime error events sent, by code",
            ["code"], registry=r,
        )  # fmt: skip
        self.realtime_closes = Counter(
            "omni_worker_realtime_closes",
            "realtime sessions ended, by close code (client: the client closed)",
            ["code"], registry=r,
        )  # fmt: skip
        for route in Route:
            for cls in ("2xx", "4xx", "5xx"):
                self.requests.labels(route.value, cls)
        self.error_codes = frozenset(code.value for code in ErrorCode)
        for code in self.error_codes:
            self.errors.labels(code)
        for stage in self.stages:
            self.queue_depth.labels(stage)
            self.busy.labels(stage)
        for kind in REQUEST_KINDS:
            self.ttft.labels(model, kind)
        for kind in AUDIO_KINDS:  # (the series exist from the start: dashboards see zeros)
            self.ttfa.labels(model, kind)
            self.rtf.labels(model, kind)
            self.audio_streams.labels(model, kind)
            self.underruns.labels(model, kind)
        self.set_status(WorkerStatus.STARTING)

    def set_status(self, status: WorkerStatus) -> None:
        for s in WorkerStatus:
            self.status.labels(s.value).set(1.0 if s == status else 0.0)

    def observe_stages(self, queue_depth: dict[str, int], busy: dict[str, float]) -> None:
        for stage in self.stages:  # only known stages: the vocabulary is the spec's
            self.queue_depth.labels(stage).set(queue_depth.get(stage, 0))
            self.busy.labels(stage).set(busy.get(stage, 0.0))

    def render(self) -> bytes:
        return generate_latest(self.registry)
