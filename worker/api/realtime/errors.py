"""The realtime endpoint's error events: OpenAI's ``error`` event with a stable ``code``. A
client error never ends the session; the close codes say why one did end."""

from __future__ import annotations

from enum import IntEnum, StrEnum

from fleet.errors import ErrorCode, OmniError, error_type


class Code(StrEnum):
    """Every ``error.code`` the endpoint sends. The fleet's codes keep their spelling; the
    realtime-only ones are OpenAI's where OpenAI has one."""

    INVALID_JSON = ErrorCode.INVALID_JSON.value
    INVALID_REQUEST = ErrorCode.INVALID_REQUEST.value
    INVALID_AUDIO = ErrorCode.INVALID_AUDIO.value
    MODEL_NOT_FOUND = ErrorCode.MODEL_NOT_FOUND.value
    VOICE_NOT_FOUND = ErrorCode.VOICE_NOT_FOUND.value
    INVALID_API_KEY = ErrorCode.INVALID_API_KEY.value
    INVALID_SESSION_KEY = ErrorCode.INVALID_SESSION_KEY.value
    DRAINING = ErrorCode.DRAINING.value
    OVERLOADED = ErrorCode.OVERLOADED.value
    STAGE_FAILED = ErrorCode.STAGE_FAILED.value
    CONTEXT_LENGTH_EXCEEDED = ErrorCode.CONTEXT_LENGTH_EXCEEDED.value
    INTERNAL_ERROR = ErrorCode.INTERNAL_ERROR.value
    UNKNOWN_EVENT = "unknown_event"
    UNSUPPORTED_AUDIO_FORMAT = "unsupported_audio_format"
    INPUT_AUDIO_BUFFER_FULL = "input_audio_buffer_full"
    INPUT_AUDIO_BUFFER_COMMIT_EMPTY = "input_audio_buffer_commit_empty"  # OpenAI's
    ACTIVE_RESPONSE = "conversation_already_has_active_response"  # OpenAI's
    RESPONSE_CANCEL_NOT_ACTIVE = "response_cancel_not_active"  # OpenAI's
    ITEM_NOT_FOUND = "item_not_found"
    ENDPOINT_NOT_SERVED = ErrorCode.ENDPOINT_NOT_SERVED.value
    TOO_MANY_SESSIONS = "too_many_sessions"
    SESSION_EXPIRED = "session_expired"


class Close(IntEnum):
    """WebSocket close codes (RFC 6455) the endpoint ends a session with."""

    NORMAL = 1000
    POLICY = 1008  # refused: bad token or model, session too long
    SERVICE_RESTART = 1012  # the worker drains: reconnect (the conversation resumes elsewhere)
    TRY_AGAIN_LATER = 1013  # the worker is at its session limit


class RealtimeError(Exception):
    def __init__(
        self, code: Code | ErrorCode, message: str, param: str | None = None, status: int = 400
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.status = status

    @classmethod
    def from_omni(cls, exc: OmniError) -> RealtimeError:
        return cls(exc.code, exc.message, exc.param, exc.status)

    def event(self, client_event_id: str | None = None) -> dict:
        return {
            "type": "error",
            "error": {
                "type": error_type(self.status),
                "code": self.code.value,
                "message": self.message,
                "param": self.param,
                "event_id": client_event_id,
            },
        }
