"""Every knob of ``omni-router``: one strict settings model (CLI flag = ``OMNI_`` env var)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from fleet.settings import OmniSettings


class Policy(StrEnum):
    CACHE_AWARE = "cache_aware"  # a chat goes where its prompt's prefix is cached; else `load`
    LOAD = "load"
    LEAST_INFLIGHT = "least_inflight"
    ROUND_ROBIN = "round_robin"
    RANDOM = "random"
    HASH = "hash"


# the scaling signal's targets for a model without its own (router/scaling.py)
_SCALE_DEFAULTS = {"scale_in_flight": "8", "scale_first_output_s": "2.0"}


class RouterSettings(OmniSettings):
    """omni-router: one address in front of a fleet's workers. Every flag is also an OMNI_
    environment variable; a flag wins over its variable, a variable over the default."""

    host: str = Field("127.0.0.1", description="address to listen on (0.0.0.0: every interface)")
    port: int = Field(8080, ge=0, le=65535, description="port to listen on")
    processes: int = Field(1, ge=1, le=64, description="router processes on one port")
    worker: list[str] = Field(
        default_factory=list,
        description="static worker base URL (repeatable); serves any model, probed on /health",
        json_schema_extra={"metavar": "URL"},
    )
    static_capacity: int = Field(1024, ge=1, description="capacity assumed for a static worker")
    static_prefix_cache_tokens: int = Field(
        65536, ge=0, description="prefix cache assumed for a static worker (0: it has none)"
    )

    # selection and affinity
    policy: Policy = Field(Policy.CACHE_AWARE, description="how a worker is picked for a request")
    prefix_bound: float = Field(
        1.5,
        ge=1.0,
        description="a cached prefix yields when its worker is above bound x mean load + slack",
        json_schema_extra={"metavar": "FACTOR"},
    )
    prefix_slack: int = Field(
        2, ge=0, description="requests a cached prefix's worker may hold above the bound"
    )
    prefix_max_blocks: int = Field(
        262144, ge=1024, description="prompt blocks the cache-aware policy remembers (memory)"
    )
    session_header: str = Field(
        "x-session-id",
        description="request header that carries a session key (sessions stick to a worker)",
        json_schema_extra={"metavar": "NAME"},
    )
    session_from_user: bool = Field(True, description="use the body's `user` as a session key")
    session_ttl_s: float = Field(1800.0, gt=0, description="a session binding lives this long")
    affinity_bound: float = Field(
        1.25,
        ge=1.0,
        description="a binding yields when its worker is above bound x mean load",
        json_schema_extra={"metavar": "FACTOR"},
    )
    move_log_interval_s: float = Field(
        60.0, gt=0, description="period of the log line that sums up session moves"
    )

    # admission and limits
    max_in_flight: int = Field(8192, ge=1, description="in-flight limit over all processes")
    max_body_bytes: int = Field(
        32 * 1024 * 1024, ge=1024, description="largest request body: larger gets 413"
    )
    max_url_bytes: int = Field(
        8192, ge=256, description="longest request target (path and query): longer gets 414"
    )
    max_header_bytes: int = Field(
        32768, ge=1024, description="largest request header block (names + values): larger gets 431"
    )
    retry_after_s: int = Field(
        1, ge=0, description="Retry-After of a 503 or 429 answered by the router (seconds)"
    )
    max_pipelined: int = Field(
        8, ge=1, description="pipelined requests queued behind the one answered, then reads pause"
    )
    max_connections: int = Field(
        0,
        ge=0,
        description="client connections per process, more get 503 (0: from the descriptor limit)",
    )
    fd_reserve: int = Field(
        256, ge=0, description="descriptors kept free for probes, Redis and worker connections"
    )
    client_idle_timeout_s: float = Field(
        75.0, gt=0, description="close a client connection idle this long between requests"
    )

    # timeouts and retries
    connect_timeout_s: float = Field(2.0, gt=0, description="one connect to a worker")
    headers_timeout_s: float = Field(300.0, gt=0, description="request sent -> response headers")
    idle_timeout_s: float = Field(120.0, gt=0, description="longest pause between body chunks")
    client_timeout_s: float = Field(
        60.0, gt=0, description="a client that stalls this long mid-request gets 408 (slowloris)"
    )
    request_deadline_s: float = Field(10.0, gt=0, description="budget for connect retries")
    max_attempts: int = Field(3, ge=1, description="workers tried when connecting fails")
    retry_backoff_s: float = Field(0.02, ge=0, description="base of the jittered backoff")
    max_stream_failovers: int = Field(
        2, ge=0, description="times a stream whose worker fails part way resumes on another"
    )
    stream_failover_max_age_s: float = Field(
        600.0, gt=0, description="a stream older than this is not replayed (ends with an error)"
    )

    # health
    probe_interval_s: float = Field(1.0, gt=0, description="period of each worker's /health probe")
    probe_timeout_s: float = Field(1.0, gt=0, description="one /health probe or /v1/models query")
    healthy_after: int = Field(1, ge=1, description="probe successes that make a worker healthy")
    unhealthy_after: int = Field(2, ge=1, description="probe failures that make it unhealthy")
    breaker_failures: int = Field(5, ge=1, description="consecutive 5xx/transport failures")
    breaker_open_s: float = Field(5.0, gt=0, description="open time before the half-open probe")

    # discovery
    resync_interval_s: float = Field(
        1.0, gt=0, description="period of the full re-read of the fleet from Redis"
    )
    redis_timeout_s: float = Field(1.0, gt=0, description="one Redis command")

    # security
    api_key: list[SecretStr] = Field(
        default_factory=list, description="client API key accepted as Bearer (repeatable)"
    )
    worker_token: SecretStr | None = Field(
        None, description="sent to workers as x-omni-worker-token"
    )

    # the signal to scale on (router/scaling.py): per model, published in Redis and /metrics
    scale_in_flight: list[str] = Field(
        default_factory=lambda: [_SCALE_DEFAULTS["scale_in_flight"]],
        description="requests one worker should hold: N, or MODEL=N for one model (repeatable)",
        json_schema_extra={"metavar": "TARGET"},
    )
    scale_first_output_s: list[str] = Field(
        default_factory=lambda: [_SCALE_DEFAULTS["scale_first_output_s"]],
        description="p50 time to first audio/token to keep under: S, or MODEL=S (repeatable)",
        json_schema_extra={"metavar": "TARGET"},
    )
    scale_min_replicas: int = Field(1, ge=0, description="the signal's floor, per model")
    scale_max_replicas: int = Field(64, ge=1, description="the signal's ceiling, per model")
    scale_interval_s: float = Field(1.0, gt=0, description="period of the signal's computation")

    # a whole fleet on this machine (router/local_fleet.py)
    local_workers: int = Field(
        0, ge=0, le=64, description="start Redis and N omni-worker processes here, then route"
    )
    local_spec: str = Field(
        "configs/models/tiny-omni.yaml", description="model spec of the --local-workers"
    )
    local_redis: Literal["auto", "system", "embedded"] = Field(
        "auto", description="local Redis: redis-server on PATH, or the embedded fallback"
    )
    local_ready_timeout_s: float = Field(900.0, gt=0, description="wait for local workers")

    shutdown_grace_s: float = Field(10.0, ge=0, description="wait for in-flight work on SIGTERM")
    pool_max_idle: int = Field(512, ge=0, description="idle keep-alive connections per worker")

    @field_validator("worker")
    @classmethod
    def _check_urls(cls, urls: list[str]) -> list[str]:
        out = []
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname or not parts.port:
                raise ValueError(f"worker URL {url!r} must look like http://HOST:PORT")
            out.append(f"http://{parts.hostname}:{parts.port}")
        return out

    @field_validator("session_header")
    @classmethod
    def _lower(cls, name: str) -> str:
        if not name or any(c in name for c in " :\r\n"):
            raise ValueError(f"invalid header name {name!r}")
        return name.lower()

    @field_validator("scale_in_flight", "scale_first_output_s")
    @classmethod
    def _per_model(cls, entries: list[str], info: ValidationInfo) -> list[str]:
        for entry in entries:
            model, eq, value = entry.rpartition("=")
            try:
                ok = float(value) > 0 and (not eq or bool(model))
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"{entry!r}: give a number above 0, or MODEL=NUMBER")
        if all("=" in entry for entry in entries):  # only models' own: the others, the default
            entries = [_SCALE_DEFAULTS[str(info.field_name)], *entries]
        return entries

    @model_validator(mode="after")
    def _needs_workers(self) -> RouterSettings:
        if self.scale_min_replicas > self.scale_max_replicas:
            raise ValueError("--scale-min-replicas is above --scale-max-replicas")
        if not self.worker and self.redis_url is None and not self.local_workers:
            raise ValueError(
                "give --redis-url (discovery), at least one --worker URL, or --local-workers N"
            )
        return self
