"""What a request asks for: endpoint, model, modalities, stream mode, session key, stage class."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from fleet.errors import ErrorCode, OmniError
from fleet.records import Endpoint, Modality
from router.prompt import Blocks, read_messages, read_prompt, read_response_inputs

_POST, _GET = frozenset({b"POST"}), frozenset({b"GET"})
_READ_WRITE = frozenset({b"GET", b"POST", b"DELETE"})
# path -> (endpoint, body is JSON that routing reads, methods)
Route = tuple[Endpoint, bool, frozenset[bytes]]
ROUTES: dict[bytes, Route] = {
    b"/v1/chat/completions": (Endpoint.CHAT, True, _POST),
    b"/v1/responses": (Endpoint.RESPONSES, True, _POST),
    b"/v1/completions": (Endpoint.COMPLETIONS, True, _POST),
    b"/v1/audio/speech": (Endpoint.SPEECH, True, _POST),
    b"/v1/audio/transcriptions": (Endpoint.TRANSCRIPTION, False, _POST),
    b"/v1/audio/translations": (Endpoint.TRANSLATION, False, _POST),
    b"/v1/audio/voices": (Endpoint.VOICES, False, _READ_WRITE),
    # the recordings of the speakers' consent to their cloned voices (worker.api.consents)
    b"/v1/audio/voice_consents": (Endpoint.VOICES, False, _READ_WRITE),
    b"/v1/realtime": (Endpoint.REALTIME, False, _GET),
    # text streamed into speech (a speech worker's WebSocket: worker.api.speech_stream)
    b"/v1/audio/speech/stream": (Endpoint.SPEECH, False, _POST),
}
# GET/DELETE /v1/responses/{id}[/input_items]: a stored response
_STORED_RESPONSE: Route = (Endpoint.RESPONSES, False, frozenset({b"GET", b"DELETE"}))
WEBSOCKET_ONLY = frozenset({b"/v1/realtime", b"/v1/audio/speech/stream"})
# OpenAI paths that no worker serves: refused at the router with 404 and what to use instead
# (a worker that serves one advertises an Endpoint for it, and the path moves to ROUTES)
UNSERVED: dict[bytes, str] = {
    b"/v1/embeddings": "no worker in this fleet serves embeddings",
}
# metric label of each endpoint (a fixed vocabulary)
ROUTE_LABEL = {e: e.value for e in Endpoint}

_TEXT_ONLY = frozenset({Modality.TEXT})
_TEXT_AUDIO = frozenset({Modality.TEXT, Modality.AUDIO})
_AUDIO_ONLY = frozenset({Modality.AUDIO})
_NONE: frozenset[Modality] = frozenset()
# (an enum member read from the class costs a lookup through its metaclass on every request)
_SPEECH, _COMPLETIONS, _RESPONSES = Endpoint.SPEECH, Endpoint.COMPLETIONS, Endpoint.RESPONSES
_SPOKEN_MEDIA = hash("spoken reply with media")  # salts such a prompt's chain
MAX_SESSION_KEY = 256

# What each endpoint needs of a worker's advertised modalities, before the body says more
# (a chat's parts and `modalities` add to it): speech is text in, audio out (a TTS worker
# advertises exactly that); a transcription audio in, text out (an ASR worker); the voices
# resource carries no model input or output at all (the endpoint is the capability).
ENDPOINT_IO: dict[Endpoint, tuple[frozenset[Modality], frozenset[Modality]]] = {
    Endpoint.CHAT: (_TEXT_ONLY, _TEXT_ONLY),
    Endpoint.RESPONSES: (_TEXT_ONLY, _TEXT_ONLY),
    Endpoint.COMPLETIONS: (_TEXT_ONLY, _TEXT_ONLY),
    Endpoint.SPEECH: (_TEXT_ONLY, _AUDIO_ONLY),
    Endpoint.TRANSCRIPTION: (_AUDIO_ONLY, _TEXT_ONLY),
    Endpoint.TRANSLATION: (_AUDIO_ONLY, _TEXT_ONLY),
    Endpoint.VOICES: (_NONE, _NONE),
    Endpoint.REALTIME: (_NONE, _NONE),
}


class StageClass:
    """Which stages a request loads: a text chat the thinker, speech the talker and vocoder."""

    TEXT = "text"
    SPEECH = "speech"


@dataclass(slots=True)
class Classified:
    endpoint: Endpoint
    model: str | None = None
    stream: bool = False
    inputs: frozenset[Modality] = _TEXT_ONLY
    outputs: frozenset[Modality] = _TEXT_ONLY
    session_key: str | None = None
    stage_class: str = StageClass.TEXT
    blocks: Blocks | None = None  # a text chat's prompt, for the cache-aware policy


def classify_plain(endpoint: Endpoint) -> Classified:
    """A request whose body routing does not read (uploads, voices): the endpoint says it all."""
    inputs, outputs = ENDPOINT_IO[endpoint]
    return Classified(endpoint, inputs=inputs, outputs=outputs)


def route_of(path: bytes) -> Route | None:
    route = ROUTES.get(path)
    if route is None:
        if path.startswith((b"/v1/audio/voices/", b"/v1/audio/voice_consents/")):
            return ROUTES[b"/v1/audio/voices"]
        if path.startswith(b"/v1/responses/"):  # a stored response (any worker reads Redis)
            return _STORED_RESPONSE
    return route


def check_session_key(key: str) -> str:
    if not key or len(key) > MAX_SESSION_KEY or not (key.isascii() and key.isprintable()):
        raise OmniError(
            400,
            ErrorCode.INVALID_SESSION_KEY,
            f"session key must be 1..{MAX_SESSION_KEY} printable ASCII characters",
        )
    return key


def classify_json(
    endpoint: Endpoint,
    body: bytes,
    content_type: bytes | None,
    session_from_user: bool,
    prefixes: bool = False,
) -> Classified:
    """Read the routing fields of a JSON body (parsed once; the original bytes are forwarded).
    ``prefixes``: the prompt blocks of a chat or completion too (a spoken reply's prompt with
    media in a chain of its own: the worker caches those apart, keeping their media's hidden
    states for the talker)."""
    if content_type is None or not content_type.lower().startswith(b"application/json"):
        raise OmniError(
            415,
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            "this endpoint takes Content-Type application/json",
        )
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OmniError(
            400, ErrorCode.INVALID_JSON, f"request body is not valid JSON: {exc}"
        ) from None
    if not isinstance(doc, dict):
        raise OmniError(400, ErrorCode.INVALID_REQUEST, "request body must be a JSON object")
    out = Classified(endpoint)
    model = doc.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise OmniError(400, ErrorCode.INVALID_REQUEST, "`model` must be a string", "model")
        out.model = model
    out.stream = doc.get("stream") is True
    if session_from_user:
        user = doc.get("user")
        if isinstance(user, str) and user:
            out.session_key = check_session_key(user)
    if endpoint is _SPEECH:
        out.outputs = _AUDIO_ONLY
        out.stage_class = StageClass.SPEECH
        return out
    if endpoint is _COMPLETIONS:
        out.blocks = read_prompt(doc) if prefixes else None
        return out
    if endpoint is _RESPONSES:
        # OpenAI's key for keeping related requests on one cache: the session key
        key = doc.get("prompt_cache_key")
        if isinstance(key, str) and key:
            out.session_key = check_session_key(key)
        inputs = read_response_inputs(doc)
        if inputs is not None:
            out.inputs = frozenset(inputs)
        return out
    modalities = doc.get("modalities")
    if isinstance(modalities, list) and "audio" in modalities:
        out.outputs = _TEXT_AUDIO
        out.stage_class = StageClass.SPEECH
    if doc.get("audio") is not None and out.outputs is _TEXT_ONLY:
        out.outputs = _TEXT_AUDIO
        out.stage_class = StageClass.SPEECH
    inputs, out.blocks = read_messages(doc, prefixes)
    if inputs is not None:
        out.inputs = frozenset(inputs)
        if out.blocks and out.stage_class is StageClass.SPEECH:
            out.blocks = [(hash((_SPOKEN_MEDIA, h)), n) for h, n in out.blocks]
    return out
