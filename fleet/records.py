"""Records that workers write to Redis and routers read. JSON on the wire (pydantic)."""

from __future__ import annotations

import time
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class WorkerStatus(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    UNHEALTHY = "unhealthy"


class Endpoint(StrEnum):
    """Fixed vocabulary of the OpenAI-compatible endpoints a worker may serve."""

    CHAT = "chat"  # POST /v1/chat/completions
    RESPONSES = "responses"  # /v1/responses (OpenAI's Responses API, on the chat pipeline)
    COMPLETIONS = "completions"  # POST /v1/completions (text in, text out, no chat template)
    SPEECH = "speech"  # POST /v1/audio/speech
    TRANSCRIPTION = "transcription"  # POST /v1/audio/transcriptions
    TRANSLATION = "translation"  # POST /v1/audio/translations (audio in any language -> English)
    VOICES = "voices"  # /v1/audio/voices
    REALTIME = "realtime"  # WebSocket /v1/realtime


class Modality(StrEnum):
    TEXT = "text"
    AUDIO = "audio"
    IMAGE = "image"
    VIDEO = "video"


class Capabilities(BaseModel):
    model_config = ConfigDict(extra="forbid")

    endpoints: list[Endpoint] = Field(default_factory=lambda: [Endpoint.CHAT])
    input_modalities: list[Modality] = Field(default_factory=lambda: [Modality.TEXT])
    output_modalities: list[Modality] = Field(default_factory=lambda: [Modality.TEXT])
    streaming: bool = True


class WorkerRecord(BaseModel):
    """What a worker says about itself. Rewritten on every status change."""

    model_config = ConfigDict(extra="ignore")

    id: str
    url: str  # advertised base URL, e.g. http://10.0.0.7:8100
    node: str
    model: str  # spec name, e.g. "tiny-omni"
    served_models: list[str]  # names accepted in the request's "model" field
    capabilities: Capabilities = Field(default_factory=Capabilities)
    voices: list[str] = Field(default_factory=list)  # built-in voices (uploaded ones: Redis)
    capacity: int = Field(64, ge=1, description="max concurrent requests the worker admits")
    # tokens of prompt prefix its chat engine keeps for reuse (SGLang's radix cache over the
    # plan's KV pool); 0: every prompt is computed whole. The router's cache-aware policy
    # (router/prefix.py) sends a conversation back where its prefix is, if this is above 0.
    prefix_cache_tokens: int = Field(0, ge=0)
    status: WorkerStatus = WorkerStatus.STARTING
    plan_digest: str = ""
    # The launch plan (omni-plan JSON), for dashboards. Never part of the record's JSON: the
    # store keeps it under its digest (FleetStore.plans), so resyncs stay small.
    plan: dict | None = Field(None, exclude=True)
    started_at: float = Field(default_factory=time.time)
    version: str = "0.1.0"


class ProcessMemory(BaseModel):
    """One stage process's memory: what the plan gave it and the most it has held so far
    (the caching allocator's reserved peak on a GPU, the resident peak on the CPU)."""

    model_config = ConfigDict(extra="ignore")

    device: str  # "gpu" | "cpu"
    planned_bytes: int = 0
    peak_bytes: int = 0
    # the caching allocator's cap on a GPU (the plan's share of the device); None on the CPU
    limit_fraction: float | None = None


# A chunk of a streamed audio reply this late past the audio before it has made a player that
# started at the first chunk run dry (players buffer a little: 20 ms is one WebRTC frame). The
# worker counts underruns and omni-bench simulates its listener by this one rule.
UNDERRUN_SLACK_S = 0.02


class LoadReport(BaseModel):
    """What a worker measures about itself, published several times a second."""

    model_config = ConfigDict(extra="ignore")

    worker_id: str
    at: float = Field(default_factory=time.time)
    in_flight: int = 0
    queue_depth: dict[str, int] = Field(default_factory=dict)  # stage name -> waiting+running
    busy: dict[str, float] = Field(default_factory=dict)  # stage name -> busy fraction 0..1
    active_sessions: int = 0
    ttft_ms: float | None = None  # recent time to first token (p50 of a short window)
    ttfa_ms: float | None = None  # recent time to first audio chunk
    # recent audio replies (the same window): their real-time factor (p50), and the share of
    # them a player started at their first chunk would have heard run dry (UNDERRUN_SLACK_S)
    rtf: float | None = None
    underrun_share: float | None = None
    memory: dict[str, ProcessMemory] = Field(default_factory=dict)  # stage process name ->
    healthy: bool = True


class ScaleSignal(BaseModel):
    """How many workers one model needs, as the routers compute it (router/scaling.py) and
    publish it for an autoscaler (Redis, /metrics, deploy/kubernetes/overlays/autoscaled)."""

    model_config = ConfigDict(extra="ignore")

    model: str  # the spec name its workers register (WorkerRecord.model)
    desired_replicas: int
    ready_replicas: int
    in_flight: int  # requests its ready and draining workers hold
    # the slowest ready worker's recent p50 time to first audio (else first token), seconds
    first_output_s: float | None = None
    reason: str  # which rule set desired_replicas: "load", "latency" or "minimum"
    at: float = Field(default_factory=time.time)


class EventKind(StrEnum):
    JOINED = "joined"
    READY = "ready"
    DRAINING = "draining"
    UNHEALTHY = "unhealthy"
    LEFT = "left"


class FleetEvent(BaseModel):
    kind: EventKind
    worker_id: str
    at: float = Field(default_factory=time.time)
    detail: str = ""


class VoiceRecord(BaseModel):
    """An uploaded reference voice; the audio bytes are stored beside it."""

    name: str
    created_at: float = Field(default_factory=time.time)
    bytes: int
    content_type: str = "audio/wav"
    uploaded_by: str = ""  # worker id
    sha256: str = ""
    # "" : the file as uploaded (voices stored before v0.2); PCM16_24K: what the model takes
    format: str = ""
    owner: str = ""  # fleet.api_keys.api_key_id of the uploader's API key; "" without keys
    seconds: float | None = None
    # what is said in the audio (optional): Qwen3-TTS Base then clones from the reference codes
    # as well as the speaker embedding
    transcript: str = ""
    # OpenAI's ``consent`` (the id of the speaker's recorded consent), kept with the voice
    consent: str = ""
    # OpenAI's ``type``: "audio_sample" (cloned from the stored audio) or "prompt" (designed
    # from ``prompt``, words that describe it, by a VoiceDesign model; its UTF-8 is what is
    # stored beside the record, so the quotas count it)
    type: str = "audio_sample"
    prompt: str = ""


class ConsentRecord(BaseModel):
    """A speaker's recorded consent to voices cloned from them (OpenAI's ``audio.voice_consent``:
    ``POST /v1/audio/voice_consents``); a voice upload names it by ``id``. The recording is
    stored beside it (PCM16 at 24 kHz)."""

    id: str
    name: str
    language: str  # BCP 47, as the speaker said the consent phrase
    created_at: float = Field(default_factory=time.time)
    owner: str = ""  # fleet.api_keys.api_key_id of the uploader's API key; "" without keys
    bytes: int = 0
    seconds: float = 0.0
    sha256: str = ""


PCM16_24K = "pcm16le-mono-24000"  # VoiceRecord.format of voices stored in the model's form
PROMPT_UTF8 = "prompt-utf8"  # VoiceRecord.format of a designed voice: its prompt is stored
