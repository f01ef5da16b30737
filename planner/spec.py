"""The model spec (configs/models/*.yaml): one servable variant's stage graph and settings.

The spec is the single source of truth for both the planner and the worker. Overrides (see
``planner.overrides``) may change settings but never the graph.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Device(StrEnum):
    GPU = "gpu"
    CPU = "cpu"
    AUTO = "auto"  # the node's: a GPU where it has GPUs, else the CPU (resolved by the planner)


class DType(StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP8 = "fp8"
    AUTO = "auto"  # by the device the stage lands on: bf16 on a GPU, fp32 on the CPU

    @property
    def bytes(self) -> int:
        if self is DType.AUTO:
            raise ValueError("dtype auto has no size until the stage's device is known")
        return {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}[self.value]

    def on(self, device: str) -> DType:
        """The dtype a stage runs in on ``device`` ("cpu", "gpu" or a torch device such as
        "cuda:0"): ``auto`` is bf16 on a GPU and fp32 on the CPU (bf16 on a CPU is slow and
        diverges from the references), any other dtype itself."""
        if self is not DType.AUTO:
            return self
        return DType.FP32 if device == "cpu" else DType.BF16


class Executor(StrEnum):
    """What a stage does; the worker maps each onto an implementation."""

    PREPROCESS = "preprocess"  # CPU: request -> model inputs (tokens, audio features)
    ENCODER = "encoder"  # non-autoregressive, batched with a short window
    AGGREGATE = "aggregate"  # fan-in: merges several inputs, no weights
    AUTOREGRESSIVE = "autoregressive"  # KV cache, step-level batching
    DECODE = "decode"  # CPU: token stream -> text deltas
    VOCODER = "vocoder"  # non-autoregressive: codec frames -> audio chunks


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ComponentSpec(Strict):
    """Which part of the model's checkpoint a stage holds (for weight counting and loading)."""

    module: str = Field("", description="dotted submodule of the HF model; '' = the whole model")
    exclude: list[str] = Field(default_factory=list, description="submodules counted elsewhere")
    config_dir: str = Field("", description="sub-directory with its own config.json, e.g. a codec")


class EngineSettings(Strict):
    """How a stage's engine runs: SGLang's scheduler under every autoregressive stage
    (worker/engines/sglang; on a CPU through its out-of-tree platform), the project's own
    executors under the others."""

    max_running_requests: int = Field(16, ge=1)
    max_queued_requests: int = Field(
        64,
        ge=0,
        description="requests waiting for this stage beyond the running ones (per replica); "
        "one more is refused at admission with 503 overloaded, which the router takes to "
        "another worker (429 when every one is full)",
    )
    context_length: int = Field(4096, ge=1)
    kv_budget_tokens: int | None = Field(None, ge=1, description="None: what the memory buys")
    max_new_tokens: int = Field(256, ge=1)
    kv_dtype: DType | None = Field(None, description="KV cache dtype; None = the stage's dtype")
    media_state_bytes: int = Field(
        256 * 2**20,
        ge=0,
        description="host memory for the Qwen3-Omni thinker's hidden states at the media "
        "positions of spoken replies' prompts, so that a spoken reply reuses "
        "a cached prefix with media (worker/models/qwen3_omni/media_states.py); 0: such "
        "prompts are computed whole",
    )
    encoder_cache_bytes: int = Field(
        256 * 2**20,
        ge=0,
        description="host memory for an encoder stage's outputs, kept per clip, image or video "
        "by content, so that a conversation that sends it again (every turn resends the "
        "history) does not encode it again (worker/models/qwen3_omni/encoders.py); 0: none",
    )
    prefill_chunk_tokens: int = Field(
        2048,
        ge=1,
        description="prompt tokens prefilled per step beside the running decodes (a longer "
        "prompt goes in chunks of this size); sizes the activation estimate",
    )
    prompt: Literal["tokens", "embeddings"] = Field(
        "tokens",
        description="what the model's prompts are: token ids (a language model), or embeddings "
        "its own forward builds from per-request state (a talker). SGLang runs an "
        "`embeddings` engine without its prefix cache (the token ids it holds are "
        "placeholders), CUDA graphs (the forward reads Python state), mixed prefill (its "
        "decode rows are frames, not tokens) and a grammar (no tokenizer)",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_engine(cls, data: Any) -> Any:
        """``backend`` was the choice between SGLang and the project's own torch engines,
        which are gone: ``sglang`` (what every stage runs) is still read, anything else is
        refused."""
        if isinstance(data, dict) and "backend" in data:
            data = dict(data)
            if data.pop("backend") != "sglang":
                raise ValueError(
                    "engine.backend: SGLang is the one engine of autoregressive stages (the "
                    "project's torch engines were removed); drop the field"
                )
        return data


class BatchingSettings(Strict):
    max_batch_size: int = Field(8, ge=1)
    window_ms: float = Field(2.0, ge=0)


class StreamingSettings(Strict):
    """How a vocoder decodes a stream of codec frames (``stages.X.streaming.*``): in the
    reference decode's blocks, each layer keeping its state within a block
    (worker.layers.streamed_vocoder)."""

    block_frames: int = Field(
        300, ge=1, description="frames the reference decodes in one pass (chunked_decode)"
    )
    left_context_frames: int = Field(
        25, ge=0, description="earlier frames decoded with each block but the first"
    )
    first_chunk_frames: int = Field(
        4, ge=1, description="frames in a stream's first step (the first packet)"
    )
    chunk_frames: int = Field(
        10, ge=1, description="the largest step (steps double from the first)"
    )


class MemorySettings(Strict):
    """Per-stage overrides of the planner's estimates (bytes); None = the GPU catalog's value."""

    activations_bytes: int | None = Field(None, ge=0, description="activations + workspace")
    runtime_bytes: int | None = Field(
        None, ge=0, description="per-process runtime (CUDA context, allocator, graphs)"
    )


class StageSpec(Strict):
    executor: Executor
    component: ComponentSpec | None = None
    device: Device = Device.GPU
    process: str = Field("", description="process group; stages in one group share a process")
    next: list[str] = Field(default_factory=list, description="final-payload edges")
    stream_to: list[str] = Field(default_factory=list, description="streaming edges")
    wait_for: list[str] = Field(default_factory=list, description="fan-in: inputs to merge")
    terminal: bool = False
    only_for_output: list[Literal["text", "audio", "words"]] = Field(
        default_factory=list,
        description="run only when the request asks for these outputs (words: the word "
        "timestamps of synthesized speech, an aligner stage)",
    )
    tp_size: int = Field(1, ge=1)
    dtype: DType = DType.BF16
    gpus: list[int] | None = Field(None, description="pinned node-local GPU indices")
    memory_share: float | None = Field(None, gt=0, le=1, description="colocated layouts")
    engine: EngineSettings = Field(default_factory=EngineSettings)
    batching: BatchingSettings = Field(default_factory=BatchingSettings)
    streaming: StreamingSettings = Field(default_factory=StreamingSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)


# the endpoints a spec may list: each one the worker has routes for (fleet.records.Endpoint)
EndpointName = Literal[
    "chat",
    "responses",
    "completions",
    "speech",
    "transcription",
    "translation",
    "voices",
    "realtime",
]


class CapabilitiesSpec(Strict):
    endpoints: list[EndpointName]
    input_modalities: list[Literal["text", "audio", "image", "video"]] = ["text"]
    output_modalities: list[Literal["text", "audio"]] = ["text"]

    @model_validator(mode="after")
    def _responses_on_chat(self) -> CapabilitiesSpec:
        if "responses" in self.endpoints and "chat" not in self.endpoints:
            raise ValueError(
                "endpoint 'responses' runs on the chat pipeline: list 'chat' too, or drop it"
            )
        return self


class ModelSpec(Strict):
    name: str
    description: str = ""
    served_models: list[str] = Field(default_factory=list, description="defaults to [name]")
    model_dir: str = Field(description="directory with config.json, relative to the spec file")
    capabilities: CapabilitiesSpec
    entry: str = Field(description="the stage that receives requests")
    stages: dict[str, StageSpec]
    voice_aliases: dict[str, str] = Field(
        default_factory=dict,
        description="other names of built-in voices, alias -> speaker: OpenAI's voice names "
        "(alloy, ash...) for clients that take no others",
    )

    @model_validator(mode="after")
    def _check_graph(self) -> ModelSpec:
        names = set(self.stages)
        if self.entry not in names:
            raise ValueError(f"entry {self.entry!r} is not a stage; stages: {sorted(names)}")
        for name, stage in self.stages.items():
            if not stage.process:
                stage.process = name
            for field in ("next", "stream_to", "wait_for"):
                for target in getattr(stage, field):
                    if target not in names:
                        raise ValueError(
                            f"stages.{name}.{field}: unknown stage {target!r}; "
                            f"stages: {sorted(names)}"
                        )
        if not any(s.terminal for s in self.stages.values()):
            raise ValueError("no stage is terminal: a request would never return")
        if not self.served_models:
            self.served_models = [self.name]
        self.check_processes(self.process_groups())
        return self

    def process_groups(self) -> dict[str, list[str]]:
        """Process group -> its stages, in spec order."""
        groups: dict[str, list[str]] = {}
        for name, stage in self.stages.items():
            groups.setdefault(stage.process, []).append(name)
        return groups

    def check_processes(self, groups: dict[str, list[str]]) -> None:
        """SGLang builds its process groups and global settings once a process: one
        autoregressive stage (one SGLang engine) per process."""
        for group, names in groups.items():
            on = [n for n in names if self.stages[n].executor == Executor.AUTOREGRESSIVE]
            if len(on) > 1:
                raise ValueError(
                    f"process {group!r} holds {len(on)} autoregressive stages ({', '.join(on)}):"
                    " SGLang runs one engine per process; give each its own `process`"
                )


def resolve_model_dir(spec: ModelSpec, spec_path: Path) -> Path:
    """``model_dir`` is relative to the spec file; ``~`` and absolute paths work too."""
    path = Path(spec.model_dir).expanduser()
    return path if path.is_absolute() else (spec_path.parent / path).resolve()
