"""``omni-worker`` settings: every field is a ``--flag`` and an ``OMNI_<FIELD>`` variable."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator

from fleet.settings import OmniSettings

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPEC = Path("configs/models/tiny-omni.yaml")


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "omni-fleet"


class WorkerSettings(OmniSettings):
    """Precedence: CLI flag > ``OMNI_*`` environment > default."""

    spec: Path = Field(DEFAULT_SPEC, description="model spec YAML (configs/models/*.yaml)")
    override_file: Path | None = Field(None, description="YAML of `stages.<stage>.<field>` values")
    model_dir: str | None = Field(
        None,
        json_schema_extra={"metavar": "DIR_OR_REPO"},
        description="checkpoint directory or Hugging Face repo id (local cache) that replaces "
        "the spec's model_dir",
    )
    allow_download: bool = Field(
        False, description="let --model-dir REPO_ID download what the local cache lacks"
    )
    overrides: list[str] = Field(
        default_factory=list,
        description="spec overrides `<stage>.<field>=<value>`; CLI also takes --<stage>.<field> V",
        json_schema_extra={"metavar": "STAGE.FIELD=VALUE"},
    )
    model_family: list[str] = Field(
        default_factory=list,
        description="a model family kept outside worker/models/: an importable package that "
        "exports FAMILY (docs/omni-worker.md, adding a model family; repeatable)",
        json_schema_extra={"metavar": "PACKAGE"},
    )
    host: str = Field("127.0.0.1", description="address the HTTP API binds")
    port: int = Field(8100, ge=0, le=65535, description="HTTP port (0: pick a free one)")
    advertise_url: str | None = Field(
        None, description="URL routers call; default http://host:port"
    )
    node: str = Field(default_factory=socket.gethostname, description="node name in the plan")
    worker_id: str | None = Field(None, description="fleet id; default <node>-<port>-<random>")
    cache_dir: Path = Field(default_factory=_default_cache_dir, description="weights cache")
    gpus: str | None = Field(
        None,
        description="skip GPU detection and plan for these GPUs, in omni-plan's syntax: "
        "'2xH100-80GB', 'H200-141GB', 'cpu'",
    )
    capacity: int = Field(64, ge=1, description="max concurrent requests admitted")
    heartbeat_interval: float = Field(1.0, gt=0, description="seconds between heartbeats")
    heartbeat_ttl: float = Field(3.0, gt=0, description="record TTL in seconds")
    load_interval: float = Field(0.25, gt=0, le=0.5, description="load report period (>= 2 Hz)")
    drain_timeout: float = Field(30.0, ge=0, description="SIGTERM: seconds to finish in-flight")
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="request body limit")
    max_head_bytes: int = Field(
        64 * 1024,
        ge=16 * 1024,
        description="request line + headers limit; over it: 414 (URL) or 431 (headers)",
    )
    head_timeout: float = Field(
        30.0,
        gt=0,
        description="a request head not received this long after its connection opened (or "
        "its first byte) gets 408; an idle new connection is closed",
    )
    max_connections: int = Field(
        4096, ge=16, description="open HTTP connections; one more gets 503 overloaded at once"
    )
    max_audio_seconds: float = Field(600.0, gt=0, description="longest accepted input audio")
    max_audio_decoded_bytes: int = Field(
        256 * 2**20,
        ge=2**20,
        description="largest input audio once decoded (rate x channels x seconds x 4 bytes), "
        "checked from the header before decoding",
    )
    audio_decode_threads: int = Field(
        2, ge=1, le=64, description="threads that decode uploads off the event loop"
    )
    max_prompt_bytes: int | None = Field(
        None,
        ge=1024,
        description="longest prompt text in UTF-8 bytes, refused before any work; "
        "default 32 x the spec's longest context length",
    )
    max_voice_seconds: float = Field(
        30.0, gt=0, le=600, description="longest uploaded voice (stored as 24 kHz mono pcm16)"
    )
    max_voice_upload_bytes: int = Field(
        16 * 2**20, ge=1024, description="largest voice upload file; over it: 413"
    )
    voice_quota_bytes: int = Field(
        256 * 2**20, ge=0, description="stored voices per fleet, all keys together; over it: 429"
    )
    voice_quota_bytes_per_key: int = Field(
        32 * 2**20, ge=0, description="stored voices per API key (when keys are set); over it: 429"
    )
    body_timeout: float = Field(
        60.0, gt=0, description="a request body that stalls this long gets 408 (slow clients)"
    )
    fetch_media: bool = Field(
        True, description="fetch http(s) image_url/video_url parts (off: such parts get 400)"
    )
    fetch_media_bytes: int = Field(
        20 * 2**20, ge=1024, description="largest image or video fetched from a URL; over it: 400"
    )
    fetch_media_timeout: float = Field(
        10.0, gt=0, description="seconds to fetch one image or video from a URL; over it: 400"
    )
    token: SecretStr | None = Field(
        None,
        description="token routers must send (x-omni-worker-token); OMNI_TOKEN works too",
        json_schema_extra={"env": "OMNI_WORKER_TOKEN"},
    )
    session_window: float = Field(60.0, gt=0, description="a session counts as active this long")
    realtime_max_sessions: int = Field(
        32,
        ge=0,
        description="open /v1/realtime sessions; one more gets an error event "
        "`too_many_sessions` and close code 1013 (try again later)",
    )
    realtime_max_session_seconds: float = Field(
        3600.0,
        gt=0,
        description="a realtime session's longest life; then error `session_expired`, close 1008",
    )
    realtime_max_buffer_seconds: float = Field(
        60.0,
        gt=0,
        description="input audio a realtime session buffers before a commit; an append over it "
        "gets error `input_audio_buffer_full` and is dropped",
    )
    realtime_max_items: int = Field(
        200, ge=2, description="conversation items a realtime session keeps (oldest dropped)"
    )
    realtime_conversation_ttl: float = Field(
        3600.0,
        gt=0,
        description="seconds a realtime conversation stays in Redis after its last change, "
        "for a reconnecting client to resume it",
    )

    stored_response_ttl: float = Field(
        30 * 24 * 3600.0,
        gt=0,
        description="seconds a stored response (the Responses API's store, the default) is "
        "kept for previous_response_id and GET /v1/responses/{id} (OpenAI keeps 30 days)",
    )

    @field_validator("token", mode="before")
    @classmethod
    def _token_from_env(cls, value: object) -> object:
        # The documented name is OMNI_WORKER_TOKEN; OMNI_TOKEN works through the prefix too.
        if value in (None, ""):
            return os.environ.get("OMNI_WORKER_TOKEN") or None
        return value

    @model_validator(mode="after")
    def _check(self) -> WorkerSettings:
        if self.heartbeat_ttl <= self.heartbeat_interval:
            raise ValueError(
                f"heartbeat_ttl ({self.heartbeat_ttl}s) must exceed heartbeat_interval "
                f"({self.heartbeat_interval}s), or the record expires between heartbeats"
            )
        return self

    def resolved_spec(self) -> Path:
        """The spec path; a relative default is looked up beside the package when not in cwd."""
        path = self.spec.expanduser()
        if path.is_absolute() or path.exists():
            return path
        packaged = REPO_ROOT / path
        return packaged if packaged.exists() else path

    def resolved_worker_id(self, port: int) -> str:
        return self.worker_id or f"{self.node}-{port}-{uuid.uuid4().hex[:6]}"

    def resolved_url(self, port: int) -> str:
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        host = self.host if self.host not in ("0.0.0.0", "::", "") else socket.gethostname()
        return f"http://{host}:{port}"
