"""Every knob of ``omni-bench``: one strict settings model (CLI flag = ``OMNI_BENCH_`` env var)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings

from bench.omnibench.loadgen import Loop
from bench.omnibench.workloads import Kind
from fleet.settings import cli_settings


class BenchSettings(BaseSettings):
    """omni-bench: offered load against a fleet, level by level. Every flag is also an
    OMNI_BENCH_ environment variable; a flag wins over its variable, a variable over the default."""

    # its own prefix: it runs beside daemons whose OMNI_MODEL, OMNI_API_KEY... mean otherwise
    model_config = cli_settings("OMNI_BENCH_")

    url: str | None = Field(
        None, description="router or worker base URL, e.g. http://127.0.0.1:8080"
    )
    local_workers: int = Field(
        0, ge=0, le=16, description="start a local fleet of N workers (omni-router) and bench it"
    )
    local_spec: str = Field(
        "configs/models/tiny-omni.yaml", description="model spec of the --local-workers"
    )
    api_key: SecretStr | None = Field(None, description="sent as Bearer to the router")
    model: str | None = Field(None, description="model to ask for (default: the first served)")
    workload: list[str] = Field(
        default_factory=lambda: ["chat"],
        description="KIND[:WEIGHT], repeatable: chat, speech, transcription, realtime",
        json_schema_extra={"metavar": "WORKLOAD"},
    )
    rate: list[float] = Field(
        default_factory=list, description="open loop: Poisson arrivals per second (repeatable)"
    )
    concurrency: list[int] = Field(
        default_factory=list, description="closed loop: concurrent users (repeatable)"
    )
    duration_s: float = Field(20.0, gt=0, description="how long each level sends requests")
    requests: int = Field(0, ge=0, description="exactly this many requests a level (0: by time)")
    warmup: int = Field(2, ge=0, description="requests sent one at a time first, not counted")
    idle: int = Field(
        4, ge=1,
        description="after the warm-up, requests of each workload sent one at a time to the idle "
        "fleet: the reference a level is held against",
    )  # fmt: skip
    seed: int = Field(0, description="seed of the request sequence and the arrival times")
    prompts: Path | None = Field(
        None, description='JSONL file, one {"prompt": ..., "max_tokens": N} a line'
    )
    max_tokens: int = Field(64, ge=1, description="chat reply limit (a prompt file's line wins)")
    voice: str | None = Field(None, description="speech/realtime voice (default: the first)")
    speech_max_chars: int = Field(200, ge=1, description="speech input: the prompt cut to this")
    timeout_s: float = Field(300.0, gt=0, description="one request's limit")
    out: Path = Field(
        Path("omni-bench-results"), description="folder of results.json and report.html"
    )
    progress: bool = Field(True, description="progress bars on a terminal")

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"URL {url!r} must look like http://HOST:PORT")
        return url.rstrip("/")

    @field_validator("workload")
    @classmethod
    def _check_workloads(cls, items: list[str]) -> list[str]:
        for item in items:
            name, _, weight = item.partition(":")
            if name not in Kind.__members__.values():
                raise ValueError(f"workload {name!r}: one of {', '.join(k.value for k in Kind)}")
            try:
                if weight and float(weight) <= 0:
                    raise ValueError
            except ValueError:
                raise ValueError(f"workload {item!r}: WEIGHT must be a positive number") from None
        return items

    @field_validator("rate")
    @classmethod
    def _positive_rates(cls, rates: list[float]) -> list[float]:
        if any(r <= 0 for r in rates):
            raise ValueError("every --rate must be above 0")
        return rates

    @field_validator("concurrency")
    @classmethod
    def _positive_users(cls, users: list[int]) -> list[int]:
        if any(c < 1 for c in users):
            raise ValueError("every --concurrency must be at least 1")
        return users

    @model_validator(mode="after")
    def _one_of_each(self) -> BenchSettings:
        if (self.url is None) == (self.local_workers == 0):
            raise ValueError("give either --url (a running router or worker) or --local-workers N")
        if bool(self.rate) == bool(self.concurrency):
            raise ValueError("give either --rate (open loop) or --concurrency (closed loop)")
        return self

    @property
    def mix(self) -> dict[Kind, float]:
        mix: dict[Kind, float] = {}
        for item in self.workload:
            name, _, weight = item.partition(":")
            mix[Kind(name)] = mix.get(Kind(name), 0.0) + float(weight or 1)
        return mix

    @property
    def loop(self) -> Loop:
        return Loop.OPEN if self.rate else Loop.CLOSED

    @property
    def levels(self) -> list[float]:
        return sorted(self.rate) if self.rate else sorted(float(c) for c in self.concurrency)
