"""OpenAI-style error bodies with a fixed vocabulary of codes, shared by router and worker."""

from __future__ import annotations

from enum import StrEnum

import orjson


class ErrorCode(StrEnum):
    # client errors (4xx): never count against a worker
    INVALID_JSON = "invalid_json"
    INVALID_REQUEST = "invalid_request"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    BODY_TOO_LARGE = "body_too_large"
    INVALID_AUDIO = "invalid_audio"
    AUDIO_TOO_LONG = "audio_too_long"
    AUDIO_TOO_LARGE = "audio_too_large"  # decoded size (rate x channels x seconds) over the limit
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's code for an oversize prompt
    VOICE_TOO_LARGE = "voice_too_large"
    VOICE_QUOTA_EXCEEDED = "voice_quota_exceeded"
    URI_TOO_LONG = "uri_too_long"  # 414
    HEADERS_TOO_LARGE = "headers_too_large"  # 431
    PERMISSION_DENIED = "permission_denied"  # 403
    ENDPOINT_NOT_SERVED = "endpoint_not_served"  # 404: no worker of the fleet serves this path
    MODEL_NOT_FOUND = "model_not_found"
    VOICE_NOT_FOUND = "voice_not_found"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    INVALID_API_KEY = "invalid_api_key"
    INVALID_SESSION_KEY = "invalid_session_key"
    REQUEST_TIMEOUT = "request_timeout"
    RATE_LIMITED = "rate_limited"
    # server side (5xx)
    NO_ELIGIBLE_WORKER = "no_eligible_worker"
    WORKER_UNAVAILABLE = "worker_unavailable"
    WORKER_TIMEOUT = "worker_timeout"
    STREAM_INTERRUPTED = "stream_interrupted"
    STAGE_FAILED = "stage_failed"
    DRAINING = "draining"
    OVERLOADED = "overloaded"
    TOO_MANY_CONNECTIONS = "too_many_connections"  # 503: a router's connection cap is reached
    ROUTER_EXHAUSTED = "router_exhausted"  # 503: a router is out of descriptors or buffers
    INTERNAL_ERROR = "internal_error"


_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    if status in _TYPE_BY_STATUS:
        return _TYPE_BY_STATUS[status]
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, code: ErrorCode, message: str, param: str | None = None) -> dict:
    """The JSON body of an OpenAI-style error response."""
    return {
        "error": {
            "message": message,
            "type": error_type(status),
            "param": param,
            "code": code.value,
        }
    }


def error_bytes(status: int, code: ErrorCode, message: str, param: str | None = None) -> bytes:
    return orjson.dumps(error_body(status, code, message, param))


class OmniError(Exception):
    """An error that maps onto one HTTP status and stable code."""

    def __init__(self, status: int, code: ErrorCode, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param

    def body(self) -> dict:
        return error_body(self.status, self.code, self.message, self.param)
