"""Request bodies of the OpenAI-compatible endpoints. Unknown fields are refused (a typo such
as ``modality`` must not be silently ignored), and so are values out of range (a 400 naming
the field). A chat's sampling fields are honoured by the thinker (worker.contract.sampling)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VoiceRef(Body):
    """The object form of ``voice`` that OpenAI's SDK sends for a custom voice."""

    id: str = Field(min_length=1)


def _voice_id(value: Any) -> Any:
    return VoiceRef.model_validate(value).id if isinstance(value, dict) else value


# a voice's name, given as a string or as {"id": name}
Voice = Annotated[str, StringConstraints(min_length=1), BeforeValidator(_voice_id)]


class _Sampling(Body):
    temperature: float | None = Field(None, ge=0, le=2, description="0 or unset: greedy")
    top_p: float | None = Field(None, gt=0, le=1)
    # vLLM's and SGLang's extensions of OpenAI's fields
    top_k: int | None = Field(None, ge=1)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0, le=2)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    user: str | None = None  # (a session's affinity key: worker.api.common.session_of)
    metadata: dict[str, str] | None = None  # (refused: kept only with stored completions)
    store: bool | None = None  # (true refused: nothing is stored)


class InputAudio(Body):
    data: str = Field(min_length=1, description="base64 audio file")
    # unset: any container libsndfile reads; set: the clip must be of that container
    format: Literal["wav", "mp3", "flac", "ogg"] | None = None


class TextPart(Body):
    type: Literal["text"]
    text: str


class AudioPart(Body):
    type: Literal["input_audio"]
    input_audio: InputAudio


class ImageUrl(Body):
    url: str = Field(min_length=1, description="a data:image/...;base64 URL")
    # low: the image scaled to fit 512x512 first (OpenAI's low detail); auto, high: as sent
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(Body):
    type: Literal["image_url"]
    image_url: ImageUrl


class VideoUrl(Body):
    url: str = Field(min_length=1, description="a data:video/...;base64 URL")


class VideoPart(Body):
    type: Literal["video_url"]
    video_url: VideoUrl


class FunctionCall(Body):
    name: str = Field(min_length=1, max_length=64)
    arguments: str  # JSON text, as the model wrote it


class ToolCall(Body):
    id: str = Field(min_length=1, max_length=128)
    type: Literal["function"] = "function"
    function: FunctionCall


class AudioReply(Body):
    """An assistant turn's earlier spoken reply, named by the ``message.audio.id`` it came with:
    the turn is that reply's transcript (``worker.service.WorkerService.reply_transcript``)."""

    id: str = Field(min_length=1, max_length=128)


class Message(Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | AudioPart | ImagePart | VideoPart] | None = None
    name: str | None = None
    audio: AudioReply | None = None  # an assistant turn: its earlier spoken reply, by id
    refusal: str | None = None  # an assistant turn: what it declined to answer, as its text
    tool_calls: list[ToolCall] | None = Field(None, max_length=64)  # an assistant's calls
    tool_call_id: str | None = Field(None, max_length=128)  # a tool message: what it answers


class FunctionDef(Body):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = Field(None, max_length=8192)
    parameters: dict[str, Any] | None = None  # a JSON schema (an object's)
    # a forced call is always held to the schema (constrained); with auto, a strict function's
    # call that does not fit stays text (worker.api.tools)
    strict: bool | None = None


class Tool(Body):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Body):
    name: str = Field(min_length=1, max_length=64)


class NamedToolChoice(Body):
    type: Literal["function"]
    function: NamedFunction


class AudioOutput(Body):
    voice: Voice
    format: Literal["wav", "pcm16", "pcm"] = "wav"


class StreamOptions(Body):
    include_usage: bool = False


class JsonSchemaFormat(Body):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None  # (the reply is always held to the schema: constrained)


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class TextGeneration(_Sampling):
    """The fields that chat and text completions share (worker.api.textgen)."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1, le=8)  # choices per prompt
    stop: str | list[str] | None = Field(None, max_length=4)  # (OpenAI: up to 4)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = Field(None, max_length=1024)


class ChatRequest(TextGeneration):
    messages: list[Message] = Field(min_length=1)
    modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioOutput | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


COMPLETION_MAX_PROMPTS = 16  # prompts in one /v1/completions request (each with its n choices)


class CompletionRequest(TextGeneration):
    """OpenAI's (legacy) text completion: the prompt continued as it is, without a chat
    template; several prompts (texts or token ids) in one request, each with ``n`` choices."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # (OpenAI's default)
    logprobs: int | None = Field(None, ge=0, le=5)  # alternatives per token, as OpenAI's
    echo: bool = False
    suffix: str | None = None  # (refused: no fill-in-the-middle)
    best_of: int | None = Field(None, ge=1, le=8)  # (only as many as n: nothing is ranked)


SPEECH_INPUT_CHARS = 4096  # OpenAI's limit for one input

# mulaw / alaw: G.711 telephony audio, 8 kHz, a byte per sample, no header
SpeechFormat = Literal["wav", "pcm", "mp3", "flac", "opus", "aac", "mulaw", "alaw"]
# the rates speech is resampled to (the model speaks 24 kHz)
SampleRate = Literal[8_000, 16_000, 22_050, 24_000, 44_100, 48_000]


class SpeechSampling(Body):
    """How the talker picks its codes (extensions of OpenAI's speech request, as vLLM-Omni's):
    unset fields keep the checkpoint's own sampling, ``temperature: 0`` is greedy, a ``seed``
    gives the same audio on every worker of one build."""

    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    repetition_penalty: float | None = Field(None, gt=0, le=2)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)


class SpeechRequest(SpeechSampling):
    model: str
    input: str = Field(min_length=1, max_length=SPEECH_INPUT_CHARS)
    voice: Voice
    response_format: SpeechFormat = "wav"
    sample_rate: SampleRate | None = None  # unset: 24 kHz (G.711: 8 kHz, its only rate)
    speed: float = Field(1.0, ge=0.25, le=4.0, description="tempo; the pitch stays")
    instructions: str | None = Field(None, max_length=SPEECH_INPUT_CHARS)
    language: str | None = Field(None, max_length=32, description="Qwen3-TTS: a language name")
    stream_format: Literal["audio", "sse"] | None = None
    stream: bool = False
    # the words of the synthesized speech with their times (a spec with an aligner stage):
    # the X-Word-Timestamps header of a whole response, a speech.audio.word_timestamps event
    # with stream_format sse
    word_timestamps: bool = False


class SpeechItem(Body):
    input: str = Field(min_length=1, max_length=SPEECH_INPUT_CHARS)
    voice: Voice | None = None
    instructions: str | None = Field(None, max_length=SPEECH_INPUT_CHARS)
    language: str | None = Field(None, max_length=32)


class SpeechBatchRequest(SpeechSampling):
    """Several texts in one request, generated together (``POST /v1/audio/speech/batch``);
    an item's ``voice``/``instructions``/``language`` default to the request's; item i draws
    with ``seed + i``."""

    model: str
    inputs: list[SpeechItem] = Field(min_length=1, max_length=64)
    voice: Voice | None = None
    instructions: str | None = Field(None, max_length=SPEECH_INPUT_CHARS)
    language: str | None = Field(None, max_length=32)
    response_format: SpeechFormat = "wav"
    sample_rate: SampleRate | None = None
    speed: float = Field(1.0, ge=0.25, le=4.0)


class TranslationForm(Body):
    """``/v1/audio/translations``: OpenAI's form (audio in any language -> English text)."""

    model: str
    prompt: str | None = Field(None, max_length=4096)
    response_format: Literal["json", "text", "verbose_json", "srt", "vtt"] = "json"
    temperature: float | None = Field(None, ge=0, le=1)


class TranscriptionForm(TranslationForm):
    language: str | None = Field(None, max_length=32)
    stream: bool = False
    # OpenAI's current transcription fields (worker.api.transcription._hint_and_context)
    keywords: list[Annotated[str, Field(max_length=256)]] | None = Field(None, max_length=100)
    languages: list[Annotated[str, Field(max_length=8)]] | None = Field(None, max_length=16)
    include: list[str] | None = None
    known_speaker_names: list[str] | None = None
    known_speaker_references: list[str] | None = None
    chunking_strategy: str | None = None


# -- the Responses API (/v1/responses: worker.api.responses) --------------------------------


class ResponseInputText(Body):
    type: Literal["input_text"]
    text: str


class ResponseInputImage(Body):
    type: Literal["input_image"]
    image_url: str | None = None  # a data: URL (file_id: refused, no files are kept)
    file_id: str | None = None
    detail: Literal["auto", "low", "high"] | None = None


class ResponseInputAudio(Body):
    type: Literal["input_audio"]
    input_audio: InputAudio


class ResponseOutputText(Body):
    """An earlier reply's text, given back in the input (its annotations and logprobs say how
    it was made, not what it says)."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] = Field(default_factory=list, max_length=0)
    logprobs: list[Any] | None = None


class ResponseRefusal(Body):
    type: Literal["refusal"]
    refusal: str


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class ResponseMessage(Body):
    """A message of the input: OpenAI's EasyInputMessage (no ``type``, or ``message``) and an
    earlier response's output message, given back."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: (
        str
        | list[
            ResponseInputText
            | ResponseInputImage
            | ResponseInputAudio
            | ResponseOutputText
            | ResponseRefusal
        ]
    )
    id: str | None = None
    status: ItemStatus | None = None


class ResponseFunctionCall(Body):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=128)
    name: str = Field(min_length=1, max_length=64)
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None


class ResponseFunctionCallOutput(Body):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=128)
    output: str | list[ResponseInputText]
    id: str | None = None
    status: ItemStatus | None = None


class ResponseFunctionTool(Body):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = Field(None, max_length=8192)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseNamedFunction(Body):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)


class ResponseTextFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, min_length=1, max_length=64)  # json_schema's
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # (the reply is always held to the schema: constrained)


class ResponseTextConfig(Body):
    format: ResponseTextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # (refused: no such control)


class ResponseStreamOptions(Body):
    # (true refused: no obfuscation padding is written)
    include_obfuscation: bool | None = None


class ResponsesRequest(_Sampling):
    """``POST /v1/responses``. The input items are read one by one (worker.api.responses), so
    that a wrong one is named by its place; the fields of OpenAI's hosted features (background
    runs, conversations, prompt templates, reasoning, truncation) are refused when set."""

    model: str
    input: str | list[dict[str, Any]] = Field(max_length=4096)
    instructions: str | None = None
    previous_response_id: str | None = Field(None, min_length=1, max_length=128)
    stream: bool = False
    stream_options: ResponseStreamOptions | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    include: list[str] | None = None
    text: ResponseTextConfig | None = None
    tools: list[dict[str, Any]] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | ResponseNamedFunction | None = None
    parallel_tool_calls: bool | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    prompt_cache_key: str | None = Field(None, max_length=256)  # the router's affinity key
    safety_identifier: str | None = Field(None, max_length=256)
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    # OpenAI's hosted features: refused when set (worker.api.responses.UNSERVED)
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    max_tool_calls: int | None = None
    prompt_cache_retention: str | None = None
