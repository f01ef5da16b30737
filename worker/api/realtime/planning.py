"""``response.create`` -> the engine request: a chat turn over the conversation (Qwen3-Omni:
text and audio in, text or text + audio out), or, for a text-to-speech model (a spec serving
speech but not chat, e.g. Qwen3-TTS), the user's text since the last reply, spoken."""

from __future__ import annotations

import secrets
from typing import Protocol

import numpy as np

from fleet.errors import OmniError
from fleet.records import Endpoint, Modality
from worker.api.realtime import config as cfg
from worker.api.realtime.conversation import Conversation, check_text, item_from_client
from worker.api.realtime.errors import Code, RealtimeError
from worker.api.realtime.events import ResponseIn
from worker.api.realtime.input_audio import InputAudioBuffer
from worker.api.realtime.response import ResponsePlan
from worker.api.speech import speech_generation
from worker.api.streamed_text import StreamedText
from worker.api.tools import ToolsRefused, ToolUse, checked_tool_use
from worker.api.voices import resolve_voice
from worker.contract import grammar as grammars
from worker.contract.pipeline import GenerationRequest, RequestKind
from worker.contract.sampling import Sampling
from worker.service import WorkerService


class SessionState(Protocol):
    """What a response's plan reads of its session (``RealtimeSession``)."""

    service: WorkerService
    config: cfg.SessionConfig
    model: str
    voice_audio: np.ndarray | None
    max_text_bytes: int
    buffer: InputAudioBuffer
    conversation: Conversation


def speaks_only(service: WorkerService) -> bool:
    """A text-to-speech model: each response speaks text; there is no chat turn to take."""
    endpoints = service.capabilities.endpoints
    return Endpoint.SPEECH in endpoints and Endpoint.CHAT not in endpoints


def _unspoken_text(items: list[dict]) -> str:
    """The user's text after the last assistant item (what a TTS response is to say)."""
    said: list[str] = []
    for item in reversed(items):
        if item.get("role") == "assistant":
            break
        if item.get("role") == "user":
            texts = [p.get("text") or "" for p in item["content"] if p.get("type") == "input_text"]
            said.append("".join(texts))
    return " ".join(t for t in reversed(said) if t.strip()).strip()


def tool_use(tools: list[dict], choice: str | dict, param: str) -> ToolUse | None:
    """The GA tools and choice of a session or response as the chat's ``ToolUse`` (the same
    prompt, parsing, grammar and checks as chat's function calling); None: no tools. A
    ``RealtimeError`` naming ``param`` (``session`` / ``response``) for what cannot hold."""
    if not tools:
        if choice not in ("auto", "none"):
            raise RealtimeError(Code.INVALID_REQUEST, "tool_choice needs tools", f"{param}.tools")
        return None
    named = choice.get("name") if isinstance(choice, dict) else None
    nested = [
        {"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in tools
    ]
    kind = "named" if named is not None else str(choice)
    try:
        return checked_tool_use(nested, kind, named, True, grammars.available())
    except ToolsRefused as refused:
        if refused.index is None:
            where = f"{param}.{refused.field}"
            raise RealtimeError(Code.INVALID_REQUEST, str(refused), where) from None
        where = f"{param}.tools.{refused.index}.{refused.field}"
        raise RealtimeError(Code.INVALID_REQUEST, f"{where} {refused}", where) from None


async def plan_response(
    session: SessionState, given: ResponseIn, text_in: StreamedText | None = None
) -> ResponsePlan:
    """``text_in``: a text-to-speech response that speaks text as it is written
    (``input_text_buffer.append``), after what the conversation left unspoken."""
    service, c = session.service, session.config
    modalities = cfg.modalities(given.output_modalities or given.modalities) or c.output_modalities
    if "audio" in modalities and Modality.AUDIO not in service.capabilities.output_modalities:
        raise RealtimeError(
            Code.INVALID_REQUEST,
            f"model {session.model!r} does not produce audio",
            "response.output_modalities",
        )
    voice, voice_audio = c.voice, session.voice_audio
    output = given.audio.output if given.audio else None
    asked = cfg.voice_name(output.voice if output else None) or given.voice
    if asked is not None and asked != voice:
        try:
            voice, voice_audio = await resolve_voice(service, asked, "response.audio.output.voice")
        except OmniError as exc:
            raise RealtimeError.from_omni(exc) from exc
    instructions = given.instructions if given.instructions is not None else c.instructions
    check_text(instructions, session.max_text_bytes, "response.instructions")
    extra = [
        item_from_client(i, session.buffer.max_bytes, session.max_text_bytes, c.input_format)
        for i in given.input or []
    ]
    in_conversation = given.conversation in (None, "auto")
    history = session.conversation if in_conversation else Conversation(None, "", len(extra) + 1)
    limit = cfg.max_tokens(given.max_output_tokens or given.max_response_output_tokens)
    limit = limit or c.max_output_tokens
    temperature = c.temperature if given.temperature is None else given.temperature
    top_p = c.top_p if given.top_p is None else given.top_p
    plan = ResponsePlan(
        request=GenerationRequest(request_id="", kind=RequestKind.CHAT),
        modalities=modalities,
        voice=voice,
        max_tokens=limit,
        in_conversation=in_conversation,
        metadata=given.metadata,
        output_format=c.output_format,
    )
    # the response's or the session's seed, else a random one (a response re-run after a
    # worker's death is sent whole again)
    seed = next((s for s in (given.seed, c.seed) if s is not None), None)
    seed = secrets.randbits(31) if seed is None else seed
    tools = (
        [t.model_dump(exclude_none=True) for t in given.tools]
        if given.tools is not None
        else c.tools
    )
    choice = given.tool_choice if given.tool_choice is not None else c.tool_choice
    use = tool_use(
        tools, choice if isinstance(choice, (str, dict)) else choice.model_dump(), "response"
    )
    if use is not None and speaks_only(service):
        raise RealtimeError(
            Code.INVALID_REQUEST,
            f"model {session.model!r} only speaks: it calls no tools",
            "response.tools",
        )
    if use is not None and use.choice != "none" and "audio" in modalities:
        # the talker voices the thinker's tokens as they come: it would speak a call's JSON
        raise RealtimeError(
            Code.INVALID_REQUEST,
            'function calling is served with text output: set output_modalities ["text"] (or '
            'tool_choice "none")',
            "response.output_modalities",
        )
    if speaks_only(service):
        text = _unspoken_text([*history.items, *extra])
        if text_in is not None:
            text = f"{text} {text_in.first}" if text else text_in.first
        if not text:
            raise RealtimeError(
                Code.INVALID_REQUEST,
                "nothing to speak: add a user text item (conversation.item.create) first",
                "response",
            )
        if voice is None:
            raise RealtimeError(
                Code.INVALID_REQUEST,
                "this model has no built-in voice: set session.audio.output.voice",
                "session.audio.output.voice",
            )
        try:
            plan.request = await speech_generation(service, text, voice, instructions or None, None)
        except OmniError as exc:
            raise RealtimeError.from_omni(exc) from exc
        plan.request.max_tokens = limit
        # the talker's temperature (unset: its checkpoint's sampling; 0: greedy)
        plan.request.speech_sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed)
        plan.modalities, plan.spoken, plan.text_in = ["audio"], text, text_in
        return plan
    plan.request = GenerationRequest(
        request_id="",
        kind=RequestKind.CHAT,
        messages=history.messages(instructions, extra),
        output_audio="audio" in modalities,
        voice=voice,
        voice_audio=voice_audio,
        max_tokens=limit,
        sampling=Sampling(temperature=temperature, top_p=top_p, seed=seed) if temperature else None,
        # the talker samples as its checkpoint says, seeded; temperature 0: greedy too
        speech_sampling=Sampling(temperature=0.0 if temperature == 0 else None, seed=seed),
        tools=use.tools if use is not None else None,
        grammar=use.grammar() if use is not None else None,
    )
    plan.tools = use if use is not None and use.choice != "none" else None
    return plan
