"""Limits checked before any expensive work: the prompt's size in bytes (before tokenizing,
which runs in a stage process and costs seconds per MB), and the decoded-audio limit of the
worker serving each request."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from fleet.errors import ErrorCode, OmniError
from planner.spec import Executor, ModelSpec
from worker.api import audio
from worker.settings import WorkerSettings

# A token is rarely more than a few bytes of text; 32 leaves room for long ones (runs of
# spaces, CJK, emoji), so a prompt refused here could never have fit the context anyway.
BYTES_PER_TOKEN_BOUND = 32


def max_prompt_bytes(settings: WorkerSettings, spec: ModelSpec) -> int:
    """``--max-prompt-bytes``, or 32 bytes per token of the spec's longest context."""
    if settings.max_prompt_bytes is not None:
        return settings.max_prompt_bytes
    longest = max((s.engine.context_length for s in spec.stages.values()), default=4096)
    return longest * BYTES_PER_TOKEN_BOUND


def reply_token_limit(spec: ModelSpec) -> tuple[str, int] | None:
    """The stage that writes a model's text replies (the autoregressive one streaming to the
    text decoder) and its ``max_new_tokens``; None for a model without text replies."""
    for name, stage in spec.stages.items():
        if stage.executor == Executor.AUTOREGRESSIVE and any(
            spec.stages[to].executor == Executor.DECODE for to in stage.stream_to
        ):
            return name, stage.engine.max_new_tokens
    return None


def check_max_tokens(spec: ModelSpec, asked: int | None, param: str) -> None:
    """A 400 naming ``param`` when a reply asks for more tokens than the spec lets one reply
    have. Refused rather than cut short: the operator's ``max_new_tokens`` bounds a reply's
    time and KV, and a client told "length" after fewer tokens than it asked for could not tell
    a limit from the model's own end."""
    limit = reply_token_limit(spec)
    if asked is None or limit is None or asked <= limit[1]:
        return
    stage, most = limit
    raise OmniError(
        400,
        ErrorCode.INVALID_REQUEST,
        f"{param} {asked} is over this model's {most} tokens per reply (its spec's "
        f"stages.{stage}.engine.max_new_tokens); ask for {most} or fewer",
        param,
    )


def _texts(body: dict):
    """Every prompt string of a chat, speech or completion body, as the client sent it (the
    raw JSON object, before validation)."""
    for key in ("input", "prompt", "instructions"):
        if isinstance(value := body.get(key), str):
            yield value
    prompts = body.get("prompt")
    if isinstance(prompts, list):  # a completion's several text prompts
        yield from (p for p in prompts if isinstance(p, str))
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(text := part.get("text"), str):
                    yield text


def prompt_bytes(body: dict, stop_above: int | None = None) -> int:
    """UTF-8 size of the prompt text in ``body``; stops counting once over ``stop_above``."""
    total = 0
    for text in _texts(body):
        # str.isascii() is O(1) in CPython, and then the length is the byte count
        total += len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if stop_above is not None and total > stop_above:
            break
    return total


def check_prompt(body: dict, limit: int) -> None:
    """400 ``context_length_exceeded`` when the prompt text is over ``limit`` bytes."""
    size = prompt_bytes(body, stop_above=limit)
    if size > limit:
        raise OmniError(
            400,
            ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            f"the prompt is over {limit} bytes of text, more than this model's context can "
            "hold; shorten the messages",
            next((k for k in ("messages", "prompt") if k in body), "input"),
        )


class RequestLimits:
    """ASGI: each request runs with its worker's decoded-audio limit, so every route that
    decodes audio applies the worker's own (several workers may share one process in tests)."""

    def __init__(self, app: ASGIApp, *, max_audio_decoded_bytes: int) -> None:
        self.app = app
        self.max_audio_decoded_bytes = max_audio_decoded_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = audio.DECODED_BYTES_LIMIT.set(self.max_audio_decoded_bytes)
        try:
            await self.app(scope, receive, send)
        finally:
            audio.DECODED_BYTES_LIMIT.reset(token)
