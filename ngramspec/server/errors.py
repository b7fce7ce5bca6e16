"""The ONE place where exceptions become llama-server / OpenAI error bodies.

Shape: {"error": {"code": <status>, "message": "...", "type": "..."}}, plus
`n_prompt_tokens` and `n_ctx` for `exceed_context_size_error`. Client mistakes
(bad JSON, wrong types, out-of-range values, bad grammar, prompt too long) are
4xx; only our own bugs are 500, and they never take the worker down.
"""
from __future__ import annotations

import logging
from typing import Any

from ..errors import NgramSpecError, error_fields, validation_message

log = logging.getLogger("ngramspec.server")

#: llama-server's error types and their HTTP status codes
STATUS_OF_TYPE = {
    "invalid_request_error": 400,
    "exceed_context_size_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "server_error": 500,
    "not_supported_error": 501,
    "unavailable_error": 503,
}
TYPE_OF_STATUS = {400: "invalid_request_error", 401: "authentication_error",
                  403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
                  413: "invalid_request_error", 415: "invalid_request_error",
                  500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}


class APIError(Exception):
    """An error the server reports as-is (status, type, message, extra fields)."""

    def __init__(self, message: str, type: str = "invalid_request_error",
                 status: int | None = None, **extra: Any):
        super().__init__(message)
        self.message, self.type = message, type
        self.status = status if status is not None else STATUS_OF_TYPE.get(type, 400)
        self.extra = extra


def loading_error() -> APIError:
    return APIError("Loading model", "unavailable_error")


def to_api_error(exc: BaseException) -> APIError:
    """Map any exception to an APIError (the single mapping used everywhere): the HTTP
    layer's own exceptions here, every domain error through `errors.error_fields`."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestValidationError):
        return APIError(validation_message(list(exc.errors())), "invalid_request_error", 400)
    if isinstance(exc, HTTPException):
        return APIError(str(exc.detail), TYPE_OF_STATUS.get(exc.status_code, "invalid_request_error"),
                        exc.status_code)
    fields = error_fields(exc)
    if fields is not None:
        return APIError(fields["message"], fields["type"], fields["status"], **fields["extra"])
    log.error("internal error: %s: %s", type(exc).__name__, exc, exc_info=exc)
    return APIError(f"internal server error: {type(exc).__name__}: {exc}", "server_error", 500)


def error_body(err: APIError) -> dict:
    body = {"code": err.status, "message": err.message, "type": err.type}
    body.update({k: v for k, v in err.extra.items() if v is not None})
    return {"error": body}


def error_response(exc: BaseException):
    from fastapi.responses import JSONResponse

    err = to_api_error(exc)
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(error_body(err), status_code=err.status, headers=headers)


class CatchAllMiddleware:
    """Any other exception before the response started -> a JSON 500 (never a dropped
    connection; Starlette's own 500 handler re-raises and resets keep-alive links)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def _send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, _send)
        except Exception as exc:
            if started:  # mid-stream: nothing sensible left to send
                log.error("error after the response started: %s", exc, exc_info=exc)
                return
            await error_response(exc)(scope, receive, send)


def install_handlers(app) -> None:
    """Route every exception through `error_response` (no 422s, no bare 500s)."""
    from fastapi.exceptions import RequestValidationError
    from pydantic import ValidationError
    from starlette.exceptions import HTTPException

    async def handler(request, exc):
        return error_response(exc)

    for cls in (APIError, NgramSpecError, RequestValidationError, ValidationError, HTTPException,
                UnicodeDecodeError, UnicodeEncodeError):
        app.add_exception_handler(cls, handler)
    app.add_middleware(CatchAllMiddleware)
