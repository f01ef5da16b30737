"""What the HTTP layer needs from the daemon: the pipeline, the spec, admission, live counters
(in-flight, sessions, recent first-token / first-audio latency) and the voice store."""

from __future__ import annotations

import asyncio
import functools
import logging
import statistics
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Protocol

import redis.exceptions

from fleet.errors import ErrorCode, OmniError
from fleet.records import (
    UNDERRUN_SLACK_S,
    Capabilities,
    ConsentRecord,
    Endpoint,
    LoadReport,
    VoiceRecord,
    WorkerStatus,
)
from fleet.responses import MemoryResponses, ResponseStore
from fleet.store import FleetStore, VoiceOwnedByAnotherKey, VoiceQuotaExceeded
from planner.spec import ModelSpec
from worker.contract.pipeline import AUDIO_OUTPUT_RATE, Pipeline, RequestKind, outputs_of
from worker.metrics import AUDIO_KINDS, WorkerMetrics
from worker.models.family import Family
from worker.models.registry import PLAIN
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

# How long a chat reply's audio is named by its id (``message.audio.expires_at``): a later turn
# may refer to the reply by that id until then (``reply_transcript``); the audio itself is not kept
REPLY_AUDIO_TTL_S = 3600
_LATENCY_WINDOW_S = 30.0
_LATENCY_SAMPLES = 64


def capabilities_of(spec: ModelSpec) -> Capabilities:
    """What a worker of ``spec`` advertises (a spec names only endpoints the worker has routes
    for: ``planner.spec.EndpointName``)."""
    c = spec.capabilities
    return Capabilities.model_validate(
        {
            "endpoints": c.endpoints,
            "input_modalities": c.input_modalities,
            "output_modalities": c.output_modalities,
            "streaming": True,
        }
    )


class RealtimeHandle(Protocol):
    """An open ``/v1/realtime`` session, as admission, load and drain see it."""

    session_id: str

    async def close_for_restart(self) -> None:
        """Stop the session's response, tell the client, close with 1012; return when closed."""


class _RecentSamples:
    """Recent samples; the report is their median (or mean) over what is younger than the
    window."""

    def __init__(self) -> None:
        self._samples: deque[tuple[float, float]] = deque(maxlen=_LATENCY_SAMPLES)

    def add(self, ms: float) -> None:
        self._samples.append((time.monotonic(), ms))

    def _recent(self) -> list[float]:
        cutoff = time.monotonic() - _LATENCY_WINDOW_S
        return [value for at, value in self._samples if at >= cutoff]

    def p50(self) -> float | None:
        recent = self._recent()
        return round(statistics.median(recent), 2) if recent else None

    def mean(self) -> float | None:
        recent = self._recent()
        return round(statistics.fmean(recent), 4) if recent else None


@dataclass
class Ticket:
    """One admitted request; ``release`` is idempotent so every exit path may call it."""

    service: WorkerService
    stages: dict[str, int] = field(default_factory=dict)  # stage -> the pipeline requests it holds
    kind: str = ""  # RequestKind value
    started: float = field(default_factory=time.monotonic)
    first_text: bool = False
    first_audio: bool = False
    released: bool = False
    # audio handed out so far (seconds), when the first and the last chunk went, and whether a
    # player started at the first chunk would have run dry before a later one
    audio_s: float = 0.0
    first_audio_at: float = 0.0
    last_audio_at: float = 0.0
    underrun: bool = False

    def text(self) -> None:
        if not self.first_text:
            self.first_text = True
            ms = (time.monotonic() - self.started) * 1000
            self.service.ttft.add(ms)
            m = self.service.metrics
            m.ttft.labels(m.model, self.kind).observe(ms / 1000)

    def audio(self, pcm16_bytes: int) -> None:
        """A chunk of ``pcm16_bytes`` of 24 kHz pcm16 goes to the client now."""
        now = time.monotonic()
        if not self.first_audio:
            self.first_audio, self.first_audio_at = True, now
            ms = (now - self.started) * 1000
            self.service.ttfa.add(ms)
            m = self.service.metrics
            m.ttfa.labels(m.model, self.kind).observe(ms / 1000)
        elif now - self.first_audio_at > self.audio_s + UNDERRUN_SLACK_S:
            self.underrun = True  # everything before this chunk would have played out
        self.audio_s += pcm16_bytes / (2 * AUDIO_OUTPUT_RATE)
        self.last_audio_at = now

    def release(self) -> None:
        if not self.released:
            self.released = True
            if self.audio_s > 0 and self.kind in AUDIO_KINDS:
                m, rtf = self.service.metrics, (self.last_audio_at - self.started) / self.audio_s
                m.rtf.labels(m.model, self.kind).observe(rtf)
                m.audio_streams.labels(m.model, self.kind).inc()
                if self.underrun:
                    m.underruns.labels(m.model, self.kind).inc()
                self.service.rtfs.add(rtf)
                self.service.underruns.add(1.0 if self.underrun else 0.0)
            self.service._release(self)


def builtin_voices(spec: ModelSpec, speakers: list[str]) -> dict[str, str]:
    """Each built-in voice's name -> the checkpoint's speaker: the speakers, then the spec's
    aliases of them (``voice_aliases``). An alias of a speaker the checkpoint lacks (a
    production spec served on another checkpoint with ``--model-dir``) is left out, said."""
    names = {s: s for s in speakers}
    for alias, speaker in spec.voice_aliases.items():
        if speaker in speakers and alias not in names:
            names[alias] = speaker
        else:
            log.warning("voice alias %r -> %r not served: %s", alias, speaker,
                        f"the checkpoint's speakers are {speakers}" if alias not in names
                        else "it is a speaker's own name")  # fmt: skip
    return names


class WorkerService:
    def __init__(
        self,
        settings: WorkerSettings,
        spec: ModelSpec,
        pipeline: Pipeline,
        worker_id: str,
        metrics: WorkerMetrics | None = None,
        family: Family = PLAIN,
    ) -> None:
        """``family``: the served checkpoint's model family (``PLAIN``: a plain model, or not
        known): what the speech and transcription endpoints speak beyond the common surface."""
        self.settings = settings
        self.spec = spec
        self.pipeline = pipeline
        self.family = family
        self.worker_id = worker_id
        self.metrics = metrics or WorkerMetrics(spec.stages, spec.name)
        self.capabilities = capabilities_of(spec)
        self.builtin_voices = builtin_voices(spec, pipeline.speakers())
        self.status = WorkerStatus.STARTING
        self.detail = "starting"
        self.store: FleetStore | None = None  # set by the daemon when Redis is configured
        # the Responses API's stored responses (in Redis too, then: the daemon sets it)
        self.responses: ResponseStore = MemoryResponses(settings.stored_response_ttl)
        self._memory_voices: dict[str, tuple[VoiceRecord, bytes]] = {}
        self._memory_consents: dict[str, ConsentRecord] = {}
        # audio id -> (expiry, text), oldest first
        self._memory_transcripts: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self.in_flight = 0
        self.waiting: Counter[str] = Counter()  # stage -> admitted pipeline requests it holds
        self.ttft = _RecentSamples()
        self.ttfa = _RecentSamples()
        self.rtfs = _RecentSamples()  # audio replies' real-time factors
        self.underruns = _RecentSamples()  # 1.0 for an audio reply that underran, else 0.0
        self._sessions: dict[str, float] = {}
        self.realtime: set[RealtimeHandle] = set()
        self.created = int(time.time())

    @functools.cached_property
    def times_speech_words(self) -> bool:
        """Whether the spec has a stage that times the words of synthesized speech (an aligner
        that runs for the ``words`` output)."""
        return any("words" in s.only_for_output for s in self.spec.stages.values())

    # -- admission ---------------------------------------------------------------------------

    def set_status(self, status: WorkerStatus, detail: str = "") -> None:
        self.status = status
        self.detail = detail or status.value
        self.metrics.set_status(status)

    @property
    def serving(self) -> bool:
        return self.status == WorkerStatus.READY and self.pipeline.status().ready

    def check_model(self, model: str | None) -> str:
        if model is None or model not in self.spec.served_models:
            raise OmniError(
                404,
                ErrorCode.MODEL_NOT_FOUND,
                f"model {model!r} is not served here; served: {self.spec.served_models}",
                "model",
            )
        return model

    def check_serves(self, model: str | None, endpoint: Endpoint) -> str:
        """``model``, if this worker serves it at ``endpoint`` (404 naming what it lacks)."""
        model = self.check_model(model)
        if endpoint not in self.capabilities.endpoints:
            raise OmniError(
                404, ErrorCode.NOT_FOUND, f"model {model!r} does not serve {endpoint.value}"
            )
        return model

    def admit(
        self,
        session_id: str | None,
        kind: RequestKind,
        *,
        output_audio: bool = False,
        requests: int = 1,
    ) -> Ticket:
        """A ticket for ``requests`` pipeline requests of ``kind`` (the n choices of a chat, the
        items of a batch), or a 503 naming what is full: the worker (``capacity``) or a stage
        (its spec's running plus queued requests)."""
        if self.status == WorkerStatus.DRAINING:
            raise OmniError(503, ErrorCode.DRAINING, "worker is draining; retry on another")
        if self.status == WorkerStatus.STARTING:
            raise OmniError(503, ErrorCode.WORKER_UNAVAILABLE, f"worker is {self.detail}")
        pipeline = self.pipeline.status()
        if not pipeline.ready or not pipeline.healthy:
            raise OmniError(
                503,
                ErrorCode.STAGE_FAILED,
                f"pipeline not ready: {pipeline.detail or 'recovering'}",
            )
        if self.in_flight >= self.settings.capacity:
            raise OmniError(
                503, ErrorCode.OVERLOADED, f"worker is at capacity ({self.settings.capacity})"
            )
        limits = self.pipeline.stage_limits(outputs_of(kind, output_audio))
        for stage, limit in limits.items():
            if self.waiting[stage] + requests > limit:
                raise OmniError(
                    503,
                    ErrorCode.OVERLOADED,
                    f"stage {stage} is full: {self.waiting[stage]} requests running or queued "
                    f"of {limit} (max_running_requests + max_queued_requests); retry on another "
                    "worker",
                )
        if session_id:
            self._sessions[session_id] = time.monotonic()
        self.in_flight += 1
        self.metrics.in_flight.set(self.in_flight)
        for stage in limits:
            self.waiting[stage] += requests
        return Ticket(self, dict.fromkeys(limits, requests), kind=kind.value)

    def _release(self, ticket: Ticket) -> None:
        self.in_flight -= 1
        self.metrics.in_flight.set(self.in_flight)
        for stage, n in ticket.stages.items():
            self.waiting[stage] -= n

    def active_sessions(self) -> int:
        """Sessions seen within the window, and every open realtime session."""
        cutoff = time.monotonic() - self.settings.session_window
        for key in [k for k, at in self._sessions.items() if at < cutoff]:
            del self._sessions[key]
        return len(self._sessions.keys() | {h.session_id for h in self.realtime})

    # -- realtime sessions -------------------------------------------------------------------

    def open_realtime(self, handle: RealtimeHandle) -> None:
        self.realtime.add(handle)
        self.metrics.realtime_sessions.set(len(self.realtime))

    def close_realtime(self, handle: RealtimeHandle) -> None:
        self.realtime.discard(handle)
        self.metrics.realtime_sessions.set(len(self.realtime))

    async def close_realtime_sessions(self) -> None:
        """The drain's last step: every open realtime session closes with 1012."""
        await asyncio.gather(*(h.close_for_restart() for h in list(self.realtime)))

    # -- load --------------------------------------------------------------------------------

    def load_report(self) -> LoadReport:
        status = self.pipeline.status()
        depth = {name: s.queue_depth for name, s in status.stages.items()}
        busy = {name: round(s.busy, 4) for name, s in status.stages.items()}
        self.metrics.observe_stages(depth, busy)
        return LoadReport(
            worker_id=self.worker_id,
            in_flight=self.in_flight,
            queue_depth=depth,
            busy=busy,
            active_sessions=self.active_sessions(),
            ttft_ms=self.ttft.p50(),
            ttfa_ms=self.ttfa.p50(),
            rtf=self.rtfs.p50(),
            underrun_share=self.underruns.mean(),
            memory=status.memory,
            healthy=status.healthy and self.status != WorkerStatus.UNHEALTHY,
        )

    # -- spoken chat replies: an assistant turn may name its earlier audio by id -------------

    async def remember_reply(self, audio_id: str, transcript: str) -> None:
        """Keep a spoken reply's transcript under its audio id for ``REPLY_AUDIO_TTL_S`` (in
        Redis when configured: the next turn may land on another worker). A store that is down
        costs only that later reference (refused then as unknown), not this reply."""
        if self.store is None:
            now, kept = time.monotonic(), self._memory_transcripts
            # one lifetime for all: the oldest expire first, so pruning stops at a live one
            while kept and next(iter(kept.values()))[0] <= now:
                kept.popitem(last=False)
            kept[audio_id] = (now + REPLY_AUDIO_TTL_S, transcript)
            return
        try:
            await self.store.put_reply_transcript(audio_id, transcript, REPLY_AUDIO_TTL_S * 1000)
        except (redis.exceptions.RedisError, OSError) as exc:
            log.warning("reply transcript %s not stored: %s", audio_id, exc)

    async def reply_transcript(self, audio_id: str) -> str | None:
        """The transcript of the spoken reply ``audio_id`` names; None: unknown or expired."""
        if self.store is None:
            kept = self._memory_transcripts.get(audio_id)
            return kept[1] if kept is not None and kept[0] > time.monotonic() else None
        try:
            return await self.store.reply_transcript(audio_id)
        except (redis.exceptions.RedisError, OSError) as exc:
            log.warning("reply transcript store unreachable: %s", exc)
            raise OmniError(
                503, ErrorCode.WORKER_UNAVAILABLE, "reply transcript store (Redis) is unreachable"
            ) from exc

    # -- voices: in Redis when configured, so every worker serves every uploaded voice --------

    def _voice_store_down(self, exc: Exception) -> OmniError:
        log.warning("voice store unreachable: %s", exc)
        return OmniError(503, ErrorCode.WORKER_UNAVAILABLE, "voice store (Redis) is unreachable")

    async def put_voice(self, record: VoiceRecord, audio: bytes) -> None:
        """Raises ``VoiceQuotaExceeded`` past ``--voice-quota-bytes`` (the fleet's, or this
        worker's own without Redis) or ``--voice-quota-bytes-per-key``."""
        fleet_quota = self.settings.voice_quota_bytes
        key_quota = self.settings.voice_quota_bytes_per_key
        if self.store is None:
            old = self._memory_voices.get(record.name)
            if old is not None and record.owner and old[0].owner not in ("", record.owner):
                raise VoiceOwnedByAnotherKey(record.name)
            others = [(r, a) for n, (r, a) in self._memory_voices.items() if n != record.name]
            total = sum(len(a) for _, a in others)
            if total + len(audio) > fleet_quota:
                raise VoiceQuotaExceeded("fleet", total, fleet_quota)
            mine = sum(len(a) for r, a in others if record.owner and r.owner == record.owner)
            if record.owner and mine + len(audio) > key_quota:
                raise VoiceQuotaExceeded("key", mine, key_quota)
            self._memory_voices[record.name] = (record, audio)
            return
        try:
            await self.store.put_voice(record, audio, fleet_quota=fleet_quota, key_quota=key_quota)
        except (redis.exceptions.RedisError, OSError) as exc:
            raise self._voice_store_down(exc) from exc

    async def get_voice(self, name: str) -> tuple[VoiceRecord, bytes] | None:
        if self.store is None:
            return self._memory_voices.get(name)
        try:
            return await self.store.get_voice(name)
        except (redis.exceptions.RedisError, OSError) as exc:
            raise self._voice_store_down(exc) from exc

    async def list_voices(self) -> list[VoiceRecord]:
        if self.store is None:
            return sorted((r for r, _ in self._memory_voices.values()), key=lambda v: v.name)
        try:
            return await self.store.list_voices()
        except (redis.exceptions.RedisError, OSError) as exc:
            raise self._voice_store_down(exc) from exc

    async def delete_voice(self, name: str, owner: str = "") -> bool:
        """Raises ``VoiceOwnedByAnotherKey`` if ``owner`` is set and another key uploaded it."""
        if self.store is None:
            old = self._memory_voices.get(name)
            if old is not None and owner and old[0].owner not in ("", owner):
                raise VoiceOwnedByAnotherKey(name)
            return self._memory_voices.pop(name, None) is not None
        try:
            return await self.store.delete_voice(name, owner)
        except (redis.exceptions.RedisError, OSError) as exc:
            raise self._voice_store_down(exc) from exc

    # -- voice consents: beside the voices (Redis, or this worker's memory) -------------------

    async def put_consent(self, record: ConsentRecord, recording: bytes | None = None) -> None:
        """A new consent with its recording, or a consent's new record (``recording`` None)."""
        if self.store is None:
            self._memory_consents[record.id] = record
            return
        try:
            await self.store.put_consent(record, recording)
        except (redis.exceptions.RedisError, OSError) as exc:
            raise self._voice_store_down(exc) from exc

    async def get_consent(self, consent_id: str) -> ConsentRecord | None:
        if self.store is None:
            return self._memory_consents.get(consent_id)
        try:
            return await self.store.get_consent(consent_id)
        except (redis.exceptions.RedisError, OSError) as exc:
            raise self._voice_store_down(exc) from exc

    async def list_consents(self) -> list[ConsentRecord]:
        if self.store is None:
            return sorted(self._memory_consents.values(), key=lambda c: (c.created_at, c.id))
        try:
            return await self.store.list_consents()
        except (redis.exceptions.RedisError, OSError) as exc:
            raise self._voice_store_down(exc) from exc

    async def delete_consent(self, consent_id: str) -> bool:
        if self.store is None:
            return self._memory_consents.pop(consent_id, None) is not None
        try:
            return await self.store.delete_consent(consent_id)
        except (redis.exceptions.RedisError, OSError) as exc:
            raise self._voice_store_down(exc) from exc
