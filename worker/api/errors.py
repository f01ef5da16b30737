"""Every error leaves the worker as an OpenAI-style body with a stable ``fleet.errors`` code,
including the ones FastAPI and Starlette would otherwise answer in their own shapes."""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from fleet.errors import ErrorCode, OmniError, error_bytes
from worker.contract.pipeline import RequestInvalid, StageFailed

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499  # nginx's convention: the client went away; nobody reads this response
# "<_io.BytesIO object at 0x7f...>": a library's message naming a Python object; the address
# tells a client about the worker's memory and nothing about its request.
_OBJECT_REPR = re.compile(r"<([A-Za-z_][\w.]*) object at 0x[0-9a-fA-F]+>")


def scrub(message: str) -> str:
    """``message`` without object reprs (``<_io.BytesIO object at 0x...>`` -> ``BytesIO``)."""
    return _OBJECT_REPR.sub(lambda m: m.group(1).rsplit(".", 1)[-1], message)


_CODE_BY_STATUS = {
    400: ErrorCode.INVALID_REQUEST,
    401: ErrorCode.INVALID_API_KEY,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.BODY_TOO_LARGE,
    415: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    422: ErrorCode.INVALID_REQUEST,
}


def error_response(
    status: int, code: ErrorCode, message: str, param: str | None = None, headers=None
) -> Response:
    return Response(
        error_bytes(status, code, scrub(message), param),
        status_code=status,
        media_type="application/json",
        headers={**(headers or {}), "x-omni-error-code": code.value},
    )


def from_omni(exc: OmniError) -> Response:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return error_response(exc.status, exc.code, exc.message, exc.param, headers)


def validation_error(errors: list, prefix_skip: int = 0) -> OmniError:
    """Pydantic's first complaint, with the dotted path of the offending field as ``param``."""
    if not errors:
        return OmniError(400, ErrorCode.INVALID_REQUEST, "invalid request")
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ())[prefix_skip:]]
    param = ".".join(loc) or None
    where = f"{param}: " if param else ""
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return OmniError(400, ErrorCode.INVALID_REQUEST, f"{where}{first.get('msg')}{more}", param)


def from_pydantic(exc: ValidationError) -> OmniError:
    return validation_error(exc.errors(include_url=False))


# The request fields a stage's refusal names: SGLang's own check of the sampling values
# (``SamplingParams.verify``: a logit_bias key outside the vocabulary, ...), "<stage>: <field> ..."
_FIELD_REFUSED = re.compile(
    r"^\w+: (logit_bias|temperature|top_p|top_k|min_p|presence_penalty|frequency_penalty"
    r"|repetition_penalty)\b"
)


def stage_error(exc: StageFailed) -> tuple[int, ErrorCode, str, str | None]:
    """Status, code, message and param for a failure raised out of the pipeline: the client's
    fault (``RequestInvalid``, 400) or the worker's (503)."""
    if isinstance(exc, RequestInvalid):
        # the stages' one sentence for a prompt that cannot fit (tokens counted in the stage)
        if "exceeds the context length" in str(exc):
            return 400, ErrorCode.CONTEXT_LENGTH_EXCEEDED, str(exc), None
        field = _FIELD_REFUSED.match(str(exc))
        return 400, ErrorCode.INVALID_REQUEST, str(exc), field[1] if field else None
    return 503, ErrorCode.STAGE_FAILED, f"pipeline stage failed: {exc}", None


def install(app: FastAPI) -> None:
    @app.exception_handler(OmniError)
    async def _omni(_: Request, exc: OmniError) -> Response:
        return from_omni(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        # FastAPI's default is a 422 in its own shape; skip the "body"/"query" location prefix.
        return from_omni(validation_error(list(exc.errors()), prefix_skip=1))

    @app.exception_handler(ValidationError)
    async def _pydantic(_: Request, exc: ValidationError) -> Response:
        return from_omni(from_pydantic(exc))

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, _: ClientDisconnect) -> Response:
        # The client closed the connection while sending its body: its own choice, not a
        # worker error. Nothing reads this response.
        log.debug("client disconnected while sending %s", request.url.path)
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(StageFailed)
    async def _stage(_: Request, exc: StageFailed) -> Response:
        return error_response(*stage_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> Response:
        code = _CODE_BY_STATUS.get(exc.status_code, ErrorCode.INVALID_REQUEST)
        if exc.status_code >= 500:
            code = ErrorCode.INTERNAL_ERROR
        return error_response(exc.status_code, code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> Response:
        log.exception("unhandled error")
        return error_response(
            500, ErrorCode.INTERNAL_ERROR, f"internal error: {type(exc).__name__}"
        )
